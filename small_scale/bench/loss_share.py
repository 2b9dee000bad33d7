"""The loss's share of a training step: measured on this CPU in one run, on a GPU by arithmetic.

    python -m small_scale.bench.loss_share [--B 2 --P 64 --T 256 --repeats 2] [--skip-0.6b]

(a) The seq default (``rpg-train`` with no flags: a 0.3M-parameter Qwen3, 16 prompts x 8
    responses, rpg-reinforce-urkl), trained in this process. Every call of the loss is timed where
    the trainer makes it: its forward around the call (input checks and statistics included), its
    backward between two gradient hooks, on the loss and on log pi (whose gradient is complete when
    the loss's backward is done and the model's begins). Share = loss time / step time (rollout,
    scoring, log-probs and update of metrics.jsonl, summed over the steps).
(b) A Qwen3-0.6B-config model (random weights, float32, from shared/data/models) on one
    micro-batch of B responses of T tokens after P prompt tokens: log-probs (the LM head in
    chunks, as the trainer takes them), the loss and backward, timed the same way. Share = loss
    time / that forward + backward. A training step also samples, scores, takes no-grad log-probs
    and steps the optimizer, so the loss's share of a whole step is smaller still.
(c) A GPU, by arithmetic: the model's forward + backward FLOPs per micro-batch (6 x the matmul
    parameters a token passes through, LM head included, attention left out: the share comes out
    too large, never too small) at an assumed MFU, against the loss's own work on the same
    micro-batch counted here: the aten ops of one forward + backward of the loss (a dispatch mode
    sees each; on a GPU each is about one kernel launch) and the bytes they read and write.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rpg_ref.core.losses as L
from small_scale.bench.common import device_name, model_config

ALGO = "rpg-reinforce-urkl"      # the default run's loss
BETA, CLIP = 1e-3, (0.2, 0.28, 10.0)
# (c)'s GPU: H100 SXM, bf16 dense peak, HBM bandwidth; eager launch cost per kernel (generous)
GPU_PEAK_FLOPS, GPU_MFU, GPU_BYTES_PER_S, LAUNCH_S = 989e12, 0.5, 3.35e12, 10e-6
# (c)'s micro-batches: (model, responses, response tokens): the paper's recipe (qwen3-4b-h100,
# one response of up to 2048 tokens per micro-batch) and the qwen3-0.6b preset (4 per micro-batch)
GPU_CASES = (("qwen3-4b", 1, 2048), ("qwen3-0.6b", 4, 2048))


class LossTimer:
    """A loss function that adds the seconds of its forward and of its backward to its totals."""

    def __init__(self, fn):
        self.fn, self.fwd, self.bwd, self.calls = fn, 0.0, 0.0, 0

    def __call__(self, logp, *args, **kwargs):
        t0 = time.perf_counter()
        loss, stats = self.fn(logp, *args, **kwargs)
        self.fwd += time.perf_counter() - t0
        self.calls += 1
        start = []
        loss.register_hook(lambda g: start.append(time.perf_counter()))
        logp.register_hook(lambda g: self._backward_done(start))
        return loss, stats

    def __getattr__(self, name):                # .spec, .formula: the loss's own
        return getattr(self.fn, name)

    def _backward_done(self, start):
        self.bwd += time.perf_counter() - start.pop()

    @property
    def total(self) -> float:
        return self.fwd + self.bwd


def seq_default(out: Path) -> dict:
    """(a): the default run in this process, its loss timed in place."""
    from rpg_ref.cli import parse_config
    from rpg_ref.trainer.train import train

    cfg = parse_config(["--no-progress", "--out", str(out)])
    timer = LossTimer(L.LOSSES[cfg.algo])
    L.LOSSES[cfg.algo] = timer
    try:
        train(cfg)
    finally:
        L.LOSSES[cfg.algo] = timer.fn
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = sum(r["time_rollout"] + r["time_scoring"] + r["time_logprob"] + r["time_update"]
               for r in rows)
    return dict(steps=len(rows), calls=timer.calls, loss=timer.total, step=step,
                update=sum(r["time_update"] for r in rows), threads=torch.get_num_threads())


def qwen3_06b(B: int, P: int, T: int, repeats: int) -> dict:
    """(b): one micro-batch of a Qwen3-0.6B-config model, forward + backward, the loss timed."""
    from rpg_ref.interfaces import Batch
    from rpg_ref.models.load import load_hf_model
    from rpg_ref.models.logprobs import token_logprobs

    torch.manual_seed(0)
    model = load_hf_model(str(model_config("qwen3-0.6b", Path())), "float32")
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(V, (B, P + T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()           # [B, T] ragged
    batch = Batch(input_ids=ids, attention_mask=torch.ones_like(ids),
                  position_ids=torch.arange(P + T).expand(B, -1), mask=mask,
                  rewards=torch.zeros(B), correct=torch.zeros(B, dtype=torch.bool))
    with torch.no_grad():
        old = token_logprobs(model, batch, 1.0) + 0.05 * torch.randn(B, T, generator=g) * mask
    adv = torch.randn(B, generator=g)
    opts = L.resolve_options(ALGO, beta=BETA, clip=CLIP, run=True)
    steps, shares = [], []
    for i in range(repeats + 1):                                  # the first is warm-up
        timer = LossTimer(L.LOSSES[ALGO])
        t0 = time.perf_counter()
        logp = token_logprobs(model, batch, 1.0)                   # [B, T]
        loss, _ = timer(logp, old, adv, mask, options=opts)
        loss.backward()
        t = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        if i:
            steps.append(t)
            shares.append(timer.total / t)
    return dict(step=min(steps), share_min=min(shares), share_max=max(shares),
                loss_ms=1e3 * min(s * t for s, t in zip(shares, steps)), tokens=int(mask.sum()))


VIEWS = {"view", "_unsafe_view", "expand", "t", "detach", "alias", "unsqueeze", "squeeze",
         "select", "slice", "as_strided", "permute", "transpose", "lift_fresh"}


class CountOps(TorchDispatchMode):
    """Counts the aten ops that compute (views left out) and the bytes they read and write."""

    def __init__(self):
        super().__init__()
        self.ops, self.bytes = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.split(".")[0] not in VIEWS:
            self.ops += 1
            tensors = [x for x in (*args, *(kwargs or {}).values(),
                                   *(out if isinstance(out, (tuple, list)) else (out,)))
                       if isinstance(x, torch.Tensor)]
            self.bytes += sum(x.numel() * x.element_size() for x in tensors)
        return out


def loss_work(B: int, T: int) -> tuple[int, int]:
    """(aten ops, bytes read and written) of one forward + backward of the default loss, [B, T]."""
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    old = logp.detach() + 0.1 * torch.randn(B, T, generator=g)
    adv, mask = torch.randn(B, generator=g), torch.ones(B, T)
    opts = L.resolve_options(ALGO, beta=BETA, clip=CLIP, run=True)
    with CountOps() as c:
        loss, _ = L.LOSSES[ALGO](logp, old, adv, mask, options=opts)
        loss.backward()
    return c.ops, c.bytes


def matmul_params(cfg: dict) -> int:
    """Parameters of the matmuls a response token passes through: every layer and the LM head."""
    H, mlp, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    layer = H * q + 2 * H * kv + q * H + 3 * H * mlp            # q, k, v, o; gate, up, down
    return cfg["num_hidden_layers"] * layer + cfg["vocab_size"] * H


def gpu_shares() -> list[dict]:
    """(c): per micro-batch, the model's forward + backward time at GPU_MFU of GPU_PEAK_FLOPS
    against the loss's kernel launches and memory traffic."""
    rows = []
    for name, B, T in GPU_CASES:
        cfg = json.loads(model_config(name, Path()).read_text())
        model_s = 6 * matmul_params(cfg) * B * T / (GPU_PEAK_FLOPS * GPU_MFU)
        ops, nbytes = loss_work(B, T)
        loss_s = ops * LAUNCH_S + nbytes / GPU_BYTES_PER_S
        rows.append(dict(model=name, B=B, T=T, model_ms=1e3 * model_s, ops=ops,
                         loss_mb=nbytes / 2**20, loss_ms=1e3 * loss_s, share=loss_s / model_s))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=2, help="(b): responses in the micro-batch")
    ap.add_argument("--P", type=int, default=64, help="(b): prompt tokens")
    ap.add_argument("--T", type=int, default=256, help="(b): response tokens (rows are ragged)")
    ap.add_argument("--repeats", type=int, default=2, help="(b): timed micro-batches")
    ap.add_argument("--skip-0.6b", dest="skip", action="store_true", help="leave (b) out")
    args = ap.parse_args()
    needed = {name for name, _, _ in GPU_CASES} | (set() if args.skip else {"qwen3-0.6b"})
    missing = sorted(str(p) for p in (model_config(n, Path()) for n in needed) if not p.is_file())
    if missing:  # before any work: (b) and (c) read the shared models' configs
        print(f"small_scale.bench.loss_share: model configs not found: {', '.join(missing)}; set "
              f"RPG_DATA_DIR to the shared data folder (../shared/data beside a clone)",
              file=sys.stderr)
        sys.exit(2)
    print(f"{device_name('cpu')}, torch {torch.__version__}")
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        a = seq_default(Path(tmp) / "run")
    torch.set_num_threads(threads)                              # the run sets its own (--threads)
    print(f"(a) seq default, {a['steps']} steps, {a['calls']} loss calls, {a['threads']} thread(s):"
          f" loss {a['loss']:.3f} s of {a['step']:.2f} s of steps: share "
          f"{a['loss'] / a['step']:.2%} (of the update phase alone: {a['loss'] / a['update']:.2%})")
    if not args.skip:
        b = qwen3_06b(args.B, args.P, args.T, args.repeats)
        print(f"(b) Qwen3-0.6B config, float32, micro-batch {args.B} x ({args.P} + {args.T}) tokens"
              f" ({b['tokens']} response tokens), {torch.get_num_threads()} threads: forward + "
              f"backward {b['step']:.2f} s, loss {b['loss_ms']:.2f} ms: share "
              f"{b['share_min']:.4%} to {b['share_max']:.4%} over {args.repeats} repeats")
    print(f"(c) GPU by arithmetic: {GPU_PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 at MFU {GPU_MFU}, "
          f"{GPU_BYTES_PER_S / 1e12:.2f} TB/s, {LAUNCH_S * 1e6:.0f} us per kernel launch")
    for r in gpu_shares():
        print(f"    {r['model']:10s} micro-batch {r['B']} x {r['T']}: model fwd+bwd "
              f"{r['model_ms']:.1f} ms; loss {r['ops']} ops, {r['loss_mb']:.1f} MiB moved, "
              f"{r['loss_ms']:.3f} ms: share {r['share']:.2%}")


if __name__ == "__main__":
    main()
