"""Atomic file writes: a file is replaced whole or not at all (a kill at any moment leaves the old
one), so a reader never sees a half-written config.json, summary.json or metrics file."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no orphan
        raise
    os.replace(tmp, path)
