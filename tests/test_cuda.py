"""The hf engine's CUDA path (static KV cache + CUDA-graph decode step): what only a GPU can check.

Skipped without a CUDA GPU; a GPU session runs them first (small_scale/bench/gpu_session.sh
tests). On a CPU the same code is covered by tests/test_hf_engine.py (inductor's CPU code, no CUDA
graphs).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (the CUDA-graph decode step)")
transformers = pytest.importorskip("transformers")

from test_hf_engine import engine, tiny_qwen3  # tests/ is on sys.path under pytest

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
DEVICE = "cuda"


def test_cuda_graph_decode_samples_what_the_eager_step_samples():
    """fp32 on the GPU: the compiled CUDA-graph decode step gives the eager step's tokens from the
    same seed, and log-probs equal to float32 rounding (1e-4: the compiled kernels sum in another
    order), on three calls in a row (warm-up, recording, replay)."""
    policy = tiny_qwen3(dtype=torch.float32).to(DEVICE)
    out = {}
    for mode in ("off", "on"):
        e = engine(policy, eos=None, compile=mode)
        assert e.compiled == (mode == "on")
        out[mode] = []
        for _ in range(3):
            torch.manual_seed(1)
            out[mode].append(e.generate(PROMPTS, 2, 1.0, 1.0, 6))
    for on, off in zip(out["on"], out["off"]):
        assert on.responses == off.responses
        diff = max(abs(a - b) for x, y in zip(on.logprobs, off.logprobs) for a, b in zip(x, y))
        assert diff < 1e-4


def test_cuda_graph_replays_sample_from_the_updated_weights_without_recompiling(monkeypatch):
    """A policy with fp32 master weights under bf16 autocast samples (greedily) from its bf16 copy
    through the CUDA-graph step. After an "update" that negates the LM head (sleep, write,
    sync_weights: the copy's tensors get new addresses), the compiled engine decodes what an
    eager engine decodes from the updated weights (the replays read the new weights, not those
    the graph was recorded with), every first token changes (argmax became argmin), and dynamo
    compiles nothing new (error_on_recompile)."""
    from rpg_ref.models.policy import HFPolicy

    policy = (
        HFPolicy(tiny_qwen3(sharpen=4.0, dtype=torch.float32), "bf16-autocast").to(DEVICE).eval()
    )
    e = engine(policy, eos=None, compile="on")
    assert e.copy is not None
    for _ in range(2):  # warm-up and recording
        before = e.generate(PROMPTS, 1, 0.0, 1.0, 6)
    e.sleep()
    with torch.no_grad():
        policy.module.lm_head.weight.neg_()
    e.sync_weights(policy)
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    after = e.generate(PROMPTS, 1, 0.0, 1.0, 6)
    eager = engine(policy, eos=None, compile="off").generate(PROMPTS, 1, 0.0, 1.0, 6)
    assert after.responses == eager.responses
    assert all(a[0] != b[0] for a, b in zip(after.responses, before.responses))
