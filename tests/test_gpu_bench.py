"""small_scale/gpu_bench.py: its FLOP / MFU arithmetic against hand-computed values, and its refusal
to run without a GPU (the GPU measurements themselves need a CUDA machine)."""
import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "gpu_bench", Path(__file__).resolve().parent.parent / "small_scale" / "gpu_bench.py")
gb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gb)


def test_step_flops_by_hand():
    """N = 1e9, 1000 trained, 1000 log-prob and 2000 generated tokens: 6e12 + 2e12 + 4e12 = 12e12."""
    f = gb.step_flops(10**9, 1000, 1000, 2000)
    assert f == {"training": 6e12, "logprob": 2e12, "generation": 4e12, "step": 12e12}
    with pytest.raises(ValueError, match="gen_tokens"):
        gb.step_flops(10**9, 1, 1, -1)


def test_mfu_by_hand():
    """12e12 FLOPs in 2 s on a 1000 TFLOP/s GPU: 6e12 FLOP/s / 1e15 = 0.006."""
    assert gb.mfu(12e12, 2.0, 1000.0) == pytest.approx(0.006, rel=1e-14)
    with pytest.raises(ValueError):
        gb.mfu(1.0, 0.0, 1000.0)


def test_summarize_drops_warmup_and_takes_medians():
    """Two steps, the first (warm-up, absurd numbers) dropped. Step 2: 1000 gen tok/s over 2 s =
    2000 generated, 500 train tok/s over 4 s = 2000 trained, response_len 500 x batch 4 = 2000
    log-prob tokens; N = 1e9: 6e9*2000 + 2e9*2000 + 2e9*2000 = 20e12 FLOPs in 10 s on 1000 TFLOP/s
    = MFU 0.002; generation 4e12 / 2 s = 0.002; training 12e12 / 4 s = 0.003; 3072 MiB = 3 GiB."""
    warm = {"gen_tokens_per_s": 1.0, "time_rollout": 99.0, "train_tokens_per_s": 1.0,
            "time_update": 99.0, "response_len": 1.0, "time_step": 999.0, "time_logprob": 9.0,
            "peak_mem_mb": 99999.0}
    row = {"gen_tokens_per_s": 1000.0, "time_rollout": 2.0, "train_tokens_per_s": 500.0,
           "time_update": 4.0, "response_len": 500.0, "time_step": 10.0, "time_logprob": 1.0,
           "peak_mem_mb": 3072.0}
    s = gb.summarize([warm, row], 10**9, 4, 1000.0)
    assert s["mfu_step"] == pytest.approx(0.002, rel=1e-14)
    assert s["mfu_generation"] == pytest.approx(0.002, rel=1e-14)
    assert s["mfu_training"] == pytest.approx(0.003, rel=1e-14)
    assert (s["step_time_s"], s["peak_gpu_mem_gib"], s["steps_measured"]) == (10.0, 3.0, 1)
    with pytest.raises(ValueError, match="more than 1"):
        gb.summarize([warm], 10**9, 4, 1000.0)


@pytest.mark.parametrize("name,peak", [("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0),
                                       ("NVIDIA H200", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0)])
def test_peak_lookup(name, peak):
    assert gb.peak_bf16_tflops(name) == peak


def test_peak_lookup_unknown_gpu():
    with pytest.raises(ValueError, match="--peak-tflops"):
        gb.peak_bf16_tflops("NVIDIA GeForce GT 710")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only machine")
def test_refuses_without_a_gpu(capsys):
    assert gb.main(["--models", "qwen3-0.6b"]) == 2
    assert "no CUDA GPU is available" in capsys.readouterr().err


def test_benchmark_flags_are_a_valid_trainer_config(tmp_path, monkeypatch):
    """The flags the benchmark hands to rpg-train parse into the intended configuration: math task,
    HF engine, 2K responses, fp32 master weights + bf16 autocast, checkpointing, no export/eval."""
    cli = pytest.importorskip("rpg_ref.cli")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the flags, not this machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = gb.argparse.Namespace(prompts=4, group=8, updates=2, steps=3, max_new_tokens=2048)
    cfg = cli.parse_config(gb.train_argv("qwen3-4b", args, tmp_path / "o"))
    assert (cfg.task, cfg.engine, cfg.max_new_tokens, cfg.device) == ("math", "hf", 2048, "cuda")
    assert (cfg.prompts_per_step * cfg.group_size // cfg.mini_batch_size, cfg.micro_batch_size) == (2, 1)
    o = cfg.task_options
    assert (o["dtype"], o["gradient_checkpointing"], o["export"], o["eval_n"]) == ("bf16-autocast", True, False, 0)
    assert o["model"].endswith("models/qwen3-4b/config.json") and cfg.engine_options["chunk"] == 8
