"""A math run's latest checkpoint as a Hugging Face checkpoint (for rpg-eval, vLLM, the hub).

    python -m rpg_ref.export OUT [DEST]        OUT/checkpoints/LATEST -> DEST (default OUT/hf)

A math run exports its final policy to OUT/hf by itself (``--math-export``); this exports any
checkpoint of a run, e.g. one that was stopped early.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from rpg_ref.models.load import export_model
from rpg_ref.tasks.math import MathTask


def export_checkpoint(out: str | Path, dest: str | Path | None = None) -> Path:
    """The latest trainer checkpoint of run folder ``out`` (OUT/checkpoints/LATEST) as an HF
    checkpoint in ``dest`` (default OUT/hf). Rebuilds the policy from OUT/config.json."""
    from safetensors.torch import load_model

    from rpg_ref.strict_json import loads
    from rpg_ref.trainer.config import Config

    out = Path(out)
    latest = out / "checkpoints" / "LATEST"
    if not (out / "config.json").is_file() or not latest.is_file():
        raise ValueError(f"{out}: not a run folder with a checkpoint (need config.json and "
                         f"checkpoints/LATEST)")
    cfg = Config(**loads((out / "config.json").read_text()))
    if cfg.task != "math":
        raise ValueError(f"{out}: a {cfg.task!r} run, not a math run")
    task = MathTask(cfg, torch.device("cpu"))
    try:
        policy = task.build_policy()
        load_model(
            policy, str(out / "checkpoints" / latest.read_text().strip() / "model.safetensors")
        )
        return export_model(policy, task.tokenizer, Path(dest) if dest else out / "hf")
    finally:
        task.close()


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rpg_ref.export",
        description="Export a math run's latest checkpoint (OUT/checkpoints/"
        "LATEST) as a Hugging Face checkpoint.",
    )
    ap.add_argument("out", help="the run folder (rpg-train --out)")
    ap.add_argument("dest", nargs="?", default=None, help="destination folder (default OUT/hf)")
    args = ap.parse_args(argv)
    try:
        dest = export_checkpoint(args.out, args.dest)
    except ValueError as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.out} -> {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
