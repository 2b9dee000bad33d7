"""Reward shaping that the loop adds to every task's reward (a task only scores its answers).

DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. for R_length), with |y| the response
length in tokens, L_max the maximum response length and L_cache the buffer (the paper's code: 512):

    R_length(y) = 0                                        if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache       if L_max - L_cache < |y| <= L_max
                = -1                                       if |y| > L_max

i.e. min(-(|y| - (L_max - L_cache)) / L_cache, 0) floored at -1; rpg-train adds
``--overlong-penalty`` times it (``--overlong-buffer`` is L_cache, ``--max-new-tokens`` L_max).
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """penalty * R_length of each response length [N] -> [N] float32; buffer 0 = no shaping."""
    if not (isinstance(max_len, int) and isinstance(buffer, int) and 0 <= buffer <= max_len):
        raise ValueError(
            f"need integers 0 <= buffer <= max_len, got buffer={buffer}, max_len={max_len}"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"response lengths must be >= 0, got {lengths.tolist()}")
    if buffer == 0:
        return torch.zeros_like(lengths, dtype=torch.float)
    r = ((max_len - buffer) - lengths).double() / buffer  # [N] float64, the integers exact
    r = torch.where(lengths > max_len, -1.0, r.clamp(max=0.0))
    return (penalty * r).float()  # [N]
