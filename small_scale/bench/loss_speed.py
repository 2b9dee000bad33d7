"""Forward + backward time of every loss vs a plain PPO-clip floor, measured in the same run.

    python -m small_scale.bench.loss_speed [--B 256 --T 2048 --repeats 25 --threads N --modes ...]

The floor (``ppo_clip_floor`` below) is the least any clipped token loss pays: one exp, a clamp,
a min, a masked mean, written as people usually write it (eager PyTorch, autograd). Each loss is
timed with its clipping on (the setting people train with), its input checks and all its
statistics, called in two ways:
  options    with a LossOptions resolved once (rpg_ref.core.losses.resolve_options): the trainer's
             call
  keywords   with loose beta/clip keywords, resolved on every call: a library caller's
The printed ratio is median(loss) / median(floor); per loss, the floor and every mode are timed
in turn, call by call, so that load on a shared machine hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import rpg_ref.core.losses as L


def ppo_clip_floor(logp, old_logp, advantages, mask, eps_low: float = 0.2, eps_high: float = 0.2):
    """Minimal token-mean PPO-clip loss with no checks and no statistics: the speed floor."""
    ratio = torch.exp(logp - old_logp)
    a = advantages[:, None] if advantages.dim() == 1 else advantages
    per_tok = -torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
    return (per_tok * mask).sum() / mask.sum()


def _time_together(fns: list, repeats: int) -> list[float]:
    """Median seconds of each fn, calls taken in turn (after one warm-up call each), so that load
    on a shared machine hits every fn alike."""
    for f in fns:
        f()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for out, f in zip(times, fns):
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


MODES = ("options", "keywords")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    B, T = args.B, args.T
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)     # [B, T] float32
    old = logp.detach() + 0.1 * torch.randn(B, T, generator=g)
    ref = logp.detach() + 0.1 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]                     # [B, T] bool

    def floor():
        ppo_clip_floor(logp, old, adv, mask.float(), 0.2, 0.28).backward()
        logp.grad = None

    def timed(name: str, mode: str):
        spec = L.SPECS[name]
        beta = 1e-3 if spec.has_kl and not spec.kl_in_reward else 0.0
        clip = None if spec.always_clips else (0.2, 0.28, 10.0)
        opts = L.resolve_options(name, beta=beta, clip=clip)
        kw = dict(options=opts) if mode == "options" else dict(beta=beta, clip=clip)

        def run():
            loss, _ = L.get_loss(name)(logp, old, adv, mask, ref_logp=ref, **kw)
            loss.backward()
            logp.grad = None
        return run

    rows = []
    for name in sorted(L.LOSSES):                      # per loss: floor and every mode in turn
        t_floor, *t_modes = _time_together([floor] + [timed(name, m) for m in args.modes],
                                           args.repeats)
        rows += [(mode, name, t, t_floor) for mode, t in zip(args.modes, t_modes)]
    rows.sort(key=lambda r: args.modes.index(r[0]))

    print(f"B={B} T={T} float32 CPU, threads={torch.get_num_threads()}, torch {torch.__version__}")
    print(f"{'mode':9s} {'loss':24s} {'ms':>8s} {'floor ms':>9s} {'ratio':>6s}")
    for mode, name, t, f in rows:
        print(f"{mode:9s} {name:24s} {1e3 * t:8.2f} {1e3 * f:9.2f} {t / f:6.2f}")
    ratio = {(md, name): t / f for md, name, t, f in rows}
    for mode in args.modes:
        worst = max(r for (md, _), r in ratio.items() if md == mode)
        print(f"{mode}: worst ratio {worst:.2f}")
    if set(MODES) <= set(args.modes):
        per_loss = [ratio["keywords", n] / ratio["options", n] for n in L.LOSSES]
        print(f"keywords vs options: {min(per_loss):.2f}x to {max(per_loss):.2f}x (every loss)")

if __name__ == "__main__":
    main()
