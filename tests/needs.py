"""What some tests need that a plain clone may lack, as skip markers (tests/conftest.py counts the
tests they will skip, and says why, before the run starts).

    @needs_data("eval", "aime24.jsonl")   the shared data folder: ../shared/data beside the clone,
                                          or $RPG_DATA_DIR (rpg_ref.math.data.data_dir)
    @needs_paper_tex                      the paper's LaTeX source: ../shared/paper/rpg_paper.tex,
                                          or $RPG_PAPER_TEX
                                          (derivations.paper_tables.paper_tex_path)
    @needs_gpu                            a CUDA device
"""

from __future__ import annotations

import pytest
import torch

from derivations.paper_tables import PAPER_ENV, paper_tex_path
from rpg_ref.math.data import data_dir

DATA_REASON = "shared data absent"
TEX_REASON = "paper .tex absent"
GPU_REASON = "no GPU"


def needs_data(*parts: str) -> pytest.MarkDecorator:
    """Skip unless data_dir()/parts exists (the folder itself when no parts are given)."""
    path = data_dir().joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"{DATA_REASON}: {path} not found; set "
                              f"RPG_DATA_DIR to the shared data folder")


needs_paper_tex = pytest.mark.skipif(
    not paper_tex_path().is_file(),
    reason=f"{TEX_REASON}: {paper_tex_path()} not found; set {PAPER_ENV} to the paper's LaTeX "
           "source",
)
needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason=f"{GPU_REASON}: CUDA is not available"
)
