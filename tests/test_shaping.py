"""DAPO's soft overlong punishment (rpg_ref.trainer.shaping), against hand-computed values."""

import pytest
import torch

from rpg_ref.trainer.shaping import overlong_penalty


def test_dapo_overlong_penalty_hand_values():
    """R_length = 0 up to L_max - L_cache, then ((L_max - L_cache) - |y|) / L_cache, -1 past L_max
    (L_max 100, L_cache 20)."""
    pen = overlong_penalty(torch.tensor([0, 80, 90, 95, 100, 101]), 100, 20)
    assert pen.dtype == torch.float32
    assert pen.tolist() == [0.0, 0.0, -0.5, -0.75, -1.0, -1.0]


def test_overlong_penalty_size_and_no_buffer():
    """max_len 10, buffer 4, size 0.5: lengths 3, 6 -> 0; 8 -> -0.25; 9 -> -0.375; 10 -> -0.5
    (-(len - 6) / 4 clipped to [-1, 0], times 0.5); buffer 0 shapes nothing."""
    pen = overlong_penalty(torch.tensor([3, 6, 8, 9, 10]), 10, 4, 0.5)
    assert pen.tolist() == [0.0, 0.0, -0.25, -0.375, -0.5]
    assert overlong_penalty(torch.tensor([10, 11]), 10, 0, 1.0).tolist() == [0.0, 0.0]


def test_overlong_penalty_refuses_bad_arguments():
    """A buffer outside [0, max_len], a non-integer one, or a negative length is refused."""
    for max_len, buffer in ((100, 101), (100, -1), (100, 2.5)):
        with pytest.raises(ValueError, match="buffer"):
            overlong_penalty(torch.tensor([1]), max_len, buffer)
    with pytest.raises(ValueError, match="lengths"):
        overlong_penalty(torch.tensor([-1, 3]), 100, 20)
