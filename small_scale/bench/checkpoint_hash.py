"""Benchmark: what verifying a checkpoint's sha256 costs next to loading it.

Not a test: it prints seconds per GiB and ratios measured in one run on this machine. A checkpoint
of a model with --gib GiB of float32 weights is written by rpg-ref's own save_checkpoint (weights
with safetensors, AdamW state twice their size with torch.save, and the manifest). Then, each
--repeat times, with the files in the page cache (the usual case right after a run stopped):

    verify   rpg_ref.trainer.checkpoint.problem(ck): every file's sha256 against the manifest
             (files hashed in parallel threads)
    read     every file read once into memory, no hashing (the floor: what any check costs)
    load     the weights loaded by safetensors and the AdamW state by torch.load (what resume
             does after the check)

and prints the median of each, their ratios, and sha256 of one thread on the largest file; also
the whole save_checkpoint (--repeat saves) and the part of it that writes the manifest.

    python -m small_scale.bench.checkpoint_hash [--gib 1] [--repeat 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rpg_ref.trainer import checkpoint


@dataclasses.dataclass
class Cfg:
    note: str = "bench"


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of float32 weights")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: the temp folder)")
    a = ap.parse_args()
    n = int(a.gib * 2**30 / 4)
    model = torch.nn.Linear(1, 1, bias=False)
    model.weight = torch.nn.Parameter(torch.randn(n, 1))
    opt = {"state": {0: {"exp_avg": torch.randn(n), "exp_avg_sq": torch.rand(n)}}}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        out = Path(tmp)
        state = {"model.safetensors": model, "optimizer.pt": opt}
        saves = [timed(lambda: checkpoint.save_checkpoint(out, 1, state, Cfg()))
                 for _ in range(a.repeat)]
        ck = out / "checkpoints" / "step_000001"
        files = sorted(p for p in ck.iterdir() if p.is_file())
        size = sum(p.stat().st_size for p in files)
        from safetensors.torch import load_file

        def read():
            for p in files:
                with open(p, "rb", buffering=0) as f:
                    buf = bytearray(1 << 22)
                    while f.readinto(buf):
                        pass

        def load():
            load_file(str(ck / "model.safetensors"))
            torch.load(ck / "optimizer.pt", weights_only=True)

        largest = max(files, key=lambda p: p.stat().st_size)
        read()  # into the page cache
        t = {"verify": [], "read": [], "load": [], "one_thread": [], "save": saves,
             "manifest": []}
        for _ in range(a.repeat):
            t["manifest"].append(timed(lambda: checkpoint.write_manifest(ck)))
            t["verify"].append(timed(lambda: checkpoint.problem(ck)))
            t["read"].append(timed(read))
            t["load"].append(timed(load))
            t["one_thread"].append(timed(lambda: checkpoint.sha256(largest)) * size
                                   / largest.stat().st_size)
        assert checkpoint.problem(ck) is None
    med = {k: statistics.median(v) for k, v in t.items()}
    gib = size / 2**30
    print(f"checkpoint: {gib:.2f} GiB in {len(files)} files; {os.cpu_count()} CPUs; "
          f"median of {a.repeat}; load average {os.getloadavg()[0]:.1f}")
    for k, label in (("verify", "verify (sha256, threads)"), ("read", "read only (floor)"),
                     ("load", "load (safetensors + torch.load)"),
                     ("one_thread", "sha256, one thread (scaled)")):
        print(f"  {label:32s} {med[k] / gib:6.2f} s/GiB")
    print(f"  {'save (all of save_checkpoint)':32s} {med['save'] / gib:6.2f} s/GiB, of which the "
          f"manifest {med['manifest'] / gib:.2f} s/GiB")
    print(f"  verify / read = {med['verify'] / med['read']:.2f}; "
          f"verify / load = {med['verify'] / med['load']:.2f}; "
          f"manifest / save = {med['manifest'] / med['save']:.2f}")


if __name__ == "__main__":
    main()
