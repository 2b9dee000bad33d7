"""Generation speed, side by side: the hf engine, the vLLM engine and plain transformers
`generate`, on the same model, prompts, batch and lengths, in one run: tokens/s and their ratios
to vLLM. Runs where vLLM is installed (on a CPU: the .venv-vllm of docs/vllm.md):

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m small_scale.bench.engine_speed

Models: "tiny" (rpg_ref.math.tiny_model.tiny_qwen3_config: 2 layers, width 64, real vocabulary) and
"0.6b-4l" (Qwen3-0.6B's shared config with 4 of its 28 layers: width 1024, 0.2B parameters),
random weights in float32. Every response runs to --new-tokens (no EOS), sampled at temperature 1;
each engine generates the batch once untimed (warm-up), then once timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

MODELS = ("tiny", "0.6b-4l")


def build_model(name: str):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from rpg_ref.math.data import data_dir
    from rpg_ref.math.tiny_model import tiny_qwen3_config
    if name == "tiny":
        d = tiny_qwen3_config()
    else:
        d = json.loads((data_dir() / "models" / "qwen3-0.6b" / "config.json").read_text())
        d.update(num_hidden_layers=4, max_window_layers=4)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen3Config(**d), dtype=torch.float32).eval()


def prompts_of(n: int, lo: int, hi: int, vocab: int) -> list:
    import torch
    g = torch.Generator().manual_seed(0)
    lengths = torch.linspace(lo, hi, n).round().long().tolist()
    return [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lengths]


def timed(fn) -> float:
    fn()  # warm-up
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(model_name: str, args) -> dict:
    from types import SimpleNamespace as NS

    import torch

    from rpg_ref.engines.hf import HFEngine
    from rpg_ref.engines.vllm import VLLMEngine
    model = build_model(model_name)
    V, G, T = model.config.vocab_size, args.group, args.new_tokens
    prompts = prompts_of(args.prompts, args.prompt_min, args.prompt_max, V)
    tokens = len(prompts) * G * T
    task = NS(eos_id=None, pad_id=0)
    secs = {}

    hf = HFEngine(model, task, NS(engine_options={}))
    secs["hf engine"] = timed(lambda: hf.generate(prompts, G, 1.0, 1.0, T))

    def plain():
        from rpg_ref.interfaces import left_pad
        ids, am = left_pad(prompts, 0, "cpu")
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=am,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=T,
                min_new_tokens=T,
                num_return_sequences=G,
                pad_token_id=0,
                eos_token_id=None,
            )
        assert out.shape == (len(prompts) * G, ids.shape[1] + T)
    secs["transformers generate"] = timed(plain)

    vllm = VLLMEngine(
        model, task, NS(seed=0, engine_options={"max_model_len": args.prompt_max + T})
    )
    try:
        secs["vLLM engine"] = timed(lambda: vllm.generate(prompts, G, 1.0, 1.0, T))
    finally:
        vllm.close()
    params = sum(p.numel() for p in model.parameters())
    return {"model": model_name, "params": params, "tokens": tokens, "seconds": secs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=16, help="responses per prompt")
    ap.add_argument("--prompt-min", type=int, default=140)
    ap.add_argument("--prompt-max", type=int, default=280)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    bad = [f"--{k.replace('_', '-')} must be >= 1, got {v}" for k, v in vars(args).items()
           if isinstance(v, int) and v < 1]
    if args.prompt_min > args.prompt_max:
        bad.append(f"--prompt-min {args.prompt_min} > --prompt-max {args.prompt_max}")
    if bad:
        print("bench_engines: " + "; ".join(bad), file=sys.stderr)
        return 2
    if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    import torch

    from small_scale.bench.common import device_name
    results = [run(m, args) for m in args.models]
    print(
        f"\n{device_name('cpu')}; {args.prompts} prompts of {args.prompt_min}-{args.prompt_max} "
        "tokens x "
        f"{args.group} responses x {args.new_tokens} new tokens, float32, torch "
        f"{torch.__version__}\n"
    )
    print("| model | engine | seconds | tokens/s | vs vLLM |")
    print("|---|---|---|---|---|")
    for r in results:
        base = r["tokens"] / r["seconds"]["vLLM engine"]
        for engine, s in r["seconds"].items():
            rate = r["tokens"] / s
            print(
                f"| {r['model']} ({r['params'] / 1e6:.0f}M) | {engine} | {s:.1f} | {rate:.0f} | "
                f"{rate / base:.2f}x |"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
