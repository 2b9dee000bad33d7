"""Mean@k / Pass@k evaluation on math sets, and the standalone `rpg-eval` command.

For a problem with n sampled responses of which c are correct:

    Mean@k = E[accuracy of one response] estimated by c / n   (needs n >= k; the paper reports
             Mean@32 with n = k = 32, "average accuracy of 32 sampled responses", after DAPO)
    Pass@k = P(at least one of k responses drawn without replacement from the n is correct)
           = 1 - C(n-c, k) / C(n, k)        (unbiased; Chen et al. 2021, "Evaluating LLMs
           = 1 - prod_{i=n-c+1}^{n} (1 - k/i)       trained on code", numerically stable form)
             and 1 when n - c < k.
Per-set scores average over problems. `rpg-eval` writes a JSON with per-set scores and per-problem
counts, and prints a table:

    rpg-eval --model CKPT_DIR --data aime24 aime25 amc23 --n 32 --k 32 --max-new-tokens 8192
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rpg_ref.models.gguf import PACKAGED, gguf_file, hf_folder, is_gguf_spec


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k for one problem with c correct out of n samples (module docstring)."""
    for name, v in (("n", n), ("c", c), ("k", k)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_at_k(n: int, c: int, k: int) -> float:
    """Mean@k for one problem: c / n (requires n >= k so that k samples exist)."""
    pass_at_k(n, c, k)  # same argument checks
    return c / n


def summarize(correct: Sequence[Sequence[bool]], ks: Sequence[int]) -> dict:
    """Per-set scores from per-problem lists of booleans (one per sample; equal n per problem)."""
    if not correct:
        raise ValueError("no problems to summarize")
    ns = {len(row) for row in correct}
    if len(ns) != 1:
        raise ValueError(f"every problem needs the same number of samples, got {sorted(ns)}")
    n = ns.pop()
    out = {"problems": len(correct), "n": n}
    for k in ks:
        if not 1 <= k <= n:
            raise ValueError(f"k={k} needs 1 <= k <= n={n}")
        cs = [sum(bool(x) for x in row) for row in correct]
        out[f"mean@{k}"] = sum(mean_at_k(n, c, k) for c in cs) / len(cs)
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in cs) / len(cs)
    return out


def format_table(results: dict) -> str:
    """A plain-text table: one row per set, one column per metric."""
    if not results:
        return "(no results)"
    metrics = [m for m in next(iter(results.values())) if "@" in m]
    head = ["set", "problems", "n"] + metrics
    rows = [[name, str(r["problems"]), str(r["n"])] + [f"{r[m]:.4f}" for m in metrics]
            for name, r in results.items()]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


# ---------------------------------------------------------------------------------- generation
def hf_generate(
    model,
    tokenizer,
    prompts: list[list[int]],
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int,
    seed: int,
) -> list[list[int]]:
    """n responses per prompt with transformers `generate` (left padding, batched); returns token
    ids cut after the first EOS, grouped as prompt-major (n consecutive rows per prompt)."""
    import torch
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    flat = [p for p in prompts for _ in range(n)]
    out = []
    device = next(model.parameters()).device
    for s in range(0, len(flat), batch_size):
        chunk = flat[s:s + batch_size]
        P = max(map(len, chunk))
        ids = torch.tensor([[pad] * (P - len(p)) + p for p in chunk], device=device)        # [b, P]
        am = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in chunk], device=device)
        kw = (
            dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
            if temperature > 0
            else dict(do_sample=False)
        )
        with torch.no_grad():
            seq = model.generate(input_ids=ids, attention_mask=am, max_new_tokens=max_new_tokens,
                                 eos_token_id=eos, pad_token_id=pad, **kw)
        for row in seq[:, P:].tolist():                                                  # [b, T]
            out.append(row[:row.index(eos) + 1] if eos in row else row)
    return out


def evaluate_sets(generate_fn, tokenizer, sets: dict, n: int, ks: Sequence[int], style: str,
                  enable_thinking: bool, checker) -> tuple[dict, dict]:
    """Generate n responses per problem with `generate_fn(prompt_ids_list, n) -> token id lists`,
    score them with `checker` (rpg_ref.math.reward.AnswerChecker) and summarize per set."""
    from rpg_ref.math.reward import bare_number_correct, chat_prompt_ids
    results, details = {}, {}
    for name, problems in sets.items():
        prompts = [chat_prompt_ids(tokenizer, p.problem, style, enable_thinking) for p in problems]
        responses = generate_fn(prompts, n)
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        golds = [p.answer for p in problems for _ in range(n)]
        # extraction runs with the check, in the time-limited worker; thinking on and no </think>
        # means no answer (rpg_ref.math.reward.answer_region)
        ok, preds = checker.check_responses(texts, golds, style, enable_thinking)
        rows = [ok[i * n:(i + 1) * n] for i in range(len(problems))]
        results[name] = summarize(rows, ks)
        results[name]["check_stats"] = checker.last_stats.as_dict()
        results[name]["mean_response_tokens"] = sum(map(len, responses)) / len(responses)
        # responses that ran into the token cap (no EOS): a score that rises as they fall may
        # measure stopping, not solving
        eos = tokenizer.eos_token_id
        results[name]["cap_hits"] = sum(not r or r[-1] != eos for r in responses) / len(responses)
        if style == "number":  # the strict reading beside the scored one: a bare number, right
            strict = [bare_number_correct(t, g) for t, g in zip(texts, golds)]
            results[name]["strict"] = sum(strict) / len(strict)
        details[name] = [
            {
                "id": p.id,
                "answer": p.answer,
                "correct": sum(r),
                "n": n,
                "first_extracted": preds[i * n],
            }
            for i, (p, r) in enumerate(zip(problems, rows))
        ]
    return results, details


# ---------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rpg-eval",
        description="Mean@k / Pass@k of a checkpoint on "
        "math sets (AIME24/25, AMC23, MATH-500 or your own JSONL/parquet).",
    )
    ap.add_argument(
        "--model", required=True, help="Hugging Face checkpoint folder (config, weights, "
        f"tokenizer), a GGUF file, or a packaged model ({', '.join(PACKAGED)}: the smollm2 extra)"
    )
    ap.add_argument("--cache-dir", default="runs/cache", help="where a GGUF model is converted "
                    "to a checkpoint folder once (rpg-train's --cache-dir)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: --model)")
    ap.add_argument(
        "--data",
        nargs="+",
        required=True,
        help="set names (aime24 aime25 amc23 math500), .jsonl/.parquet files, or hf:<id>",
    )
    ap.add_argument("--n", type=int, default=32, help="samples per problem")
    ap.add_argument(
        "--k", type=int, nargs="+", default=[32], help="k values for Mean@k and Pass@k (<= n)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    ap.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument(
        "--prompt",
        choices=["answer", "boxed", "number"],
        default="answer",
        help="answer: the paper's 'Answer: $Answer' instruction; boxed: \\boxed{} variant; "
        "number: 'Answer with just the number.', the number after the last '=' (arithmetic)",
    )
    ap.add_argument(
        "--enable-thinking", action="store_true", help="Qwen3 thinking mode in the chat template"
    )
    ap.add_argument("--batch-size", type=int, default=64, help="sequences per HF generate call")
    ap.add_argument("--limit", type=int, default=None, help="first N problems of each set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    ap.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--backend", choices=["auto", "math_verify", "normalizer"], default="auto",
                    help="answer checker (auto: math-verify when installed)")
    ap.add_argument("--check-timeout", type=float, default=5.0, help="seconds per answer check")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM engine only")
    ap.add_argument("--out", default=None, help="write the JSON results here")
    return ap


def _validate(args) -> None:
    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    bad = [k for k in args.k if not 1 <= k <= args.n]
    if bad:
        raise ValueError(f"--k values must be in [1, n={args.n}], got {bad}")
    if args.max_new_tokens < 1 or args.batch_size < 1:
        raise ValueError("--max-new-tokens and --batch-size must be >= 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise ValueError(
            f"need --temperature >= 0 and 0 < --top-p <= 1, got {args.temperature}, {args.top_p}"
        )
    if args.temperature == 0 and args.n > 1:
        raise ValueError("--temperature 0 (greedy) gives n identical samples: use --n 1 --k 1")
    if is_gguf_spec(args.model):  # converted in main, after the cheap checks
        try:
            gguf_file(args.model)
        except ValueError as e:
            raise ValueError(f"--model {e}") from e
    elif why := not_a_model(Path(args.model), tokenizer=args.tokenizer is None):
        raise ValueError(f"--model {args.model!r} {why}")
    if args.tokenizer is not None and not _has_tokenizer(Path(args.tokenizer)):
        raise ValueError(f"--tokenizer {args.tokenizer}: no tokenizer there (tokenizer.json or "
                         "tokenizer_config.json)")


WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))


def not_a_model(folder: Path, tokenizer: bool = True) -> str | None:
    """Why ``folder`` is not a Hugging Face checkpoint rpg-eval can load, as "is ..." / "has ..."
    (None: it is one); for an rpg-train run folder, where its model is or how to export one."""
    from rpg_ref.strict_json import loads

    if not folder.is_dir():
        return "is not a folder"
    try:
        config = loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    if (folder / "checkpoints").is_dir() or (isinstance(config, dict) and "algo" in config):
        if (folder / "hf" / "config.json").is_file():
            return f"is an rpg-train run folder; its exported model is {folder / 'hf'}: pass that"
        return (f"is an rpg-train run folder, not a model; `python -m rpg_ref.export {folder}` "
                f"exports a math run's policy as one")
    if not isinstance(config, dict) or "model_type" not in config:
        what = "no config.json" if config is None else "its config.json has no model_type"
        return (f"is not a Hugging Face checkpoint folder ({what}); pass the folder that holds "
                f"config.json, the weights and the tokenizer")
    if not any(any(folder.glob(w)) for w in WEIGHTS):
        return f"has no weights ({' or '.join(WEIGHTS)})"
    if tokenizer and not _has_tokenizer(folder):
        return "has no tokenizer (tokenizer.json or tokenizer_config.json); pass --tokenizer DIR"
    return None


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _validate(args)
        from rpg_ref.math.data import load_problems
        sets = {}
        for spec in args.data:
            problems = load_problems(spec, limit=args.limit)
            sets[problems[0].source if not spec.startswith("hf:") else spec[3:]] = problems
        if is_gguf_spec(args.model):
            args.model = hf_folder(args.model, args.cache_dir)
    except ValueError as e:
        print(f"rpg-eval: error: {e}", file=sys.stderr)
        return 2
    import torch
    from transformers import AutoTokenizer

    from rpg_ref.math.reward import AnswerChecker
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    device = (
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    t0 = time.time()
    if args.engine == "hf":
        from transformers import AutoModelForCausalLM
        dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()

        def generate_fn(prompts, n):
            return hf_generate(model, tokenizer, prompts, n, args.temperature, args.top_p,
                               args.max_new_tokens, args.batch_size, args.seed)
    else:
        from rpg_ref.engines.vllm import VLLMEngine
        engine = VLLMEngine.from_pretrained(args.model, seed=args.seed,
                                            gpu_memory_utilization=args.gpu_memory_utilization)

        def generate_fn(prompts, n):
            return [
                toks
                for toks, _ in engine.generate_pairs(
                    prompts, n, args.temperature, args.top_p, args.max_new_tokens, seed=args.seed
                )
            ]
    with AnswerChecker(args.backend, args.check_timeout) as checker:
        results, details = evaluate_sets(generate_fn, tokenizer, sets, args.n, args.k, args.prompt,
                                         args.enable_thinking, checker)
    print(format_table(results))
    if args.out:
        payload = {"model": args.model, "args": vars(args), "results": results, "problems": details,
                   "seconds": time.time() - t0}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(payload, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
