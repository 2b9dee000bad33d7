"""small_scale/bench/gpu.py and small_scale/bench/gpu_vs_trl.py: their arithmetic against
hand-computed values, the configurations they hand to the trainers, their refusal to run on a
missing GPU, and their whole pipeline run end to end with --device cpu on a tiny Qwen3 (the GPU
measurements themselves need a CUDA machine)."""
import json
import statistics
from pathlib import Path

import pytest
import torch

from rpg_ref.math.data import data_dir
from small_scale.bench import common as bench_common
from small_scale.bench import gpu as gb
from small_scale.bench import gpu_vs_trl as vs

SMALL_SCALE = Path(__file__).resolve().parent.parent / "small_scale"



def test_step_flops_by_hand():
    """N = 1e9, 1000 trained, 1000 log-prob and 2000 generated tokens: 6e12 + 2e12 + 4e12 =
    12e12."""
    f = gb.step_flops(10**9, 1000, 1000, 2000)
    assert f == {"training": 6e12, "logprob": 2e12, "generation": 4e12, "step": 12e12}
    with pytest.raises(ValueError, match="gen_tokens"):
        gb.step_flops(10**9, 1, 1, -1)


def test_mfu_by_hand():
    """12e12 FLOPs in 2 s on a 1000 TFLOP/s GPU: 6e12 FLOP/s / 1e15 = 0.006."""
    assert gb.mfu(12e12, 2.0, 1000.0) == pytest.approx(0.006, rel=1e-14)
    with pytest.raises(ValueError, match="seconds > 0"):
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
    assert (s["step_time_s"], s["peak_mem_gib"], s["steps_measured"]) == (10.0, 3.0, 1)
    with pytest.raises(ValueError, match="more than 1"):
        gb.summarize([warm], 10**9, 4, 1000.0)


@pytest.mark.parametrize(
    "name,peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
    ],
)
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
    HF engine with --hf-chunk auto, fp32 master weights + bf16 autocast, checkpointing for 4B (not
    for 0.6B), micro-batches by the model's token budget, no export/eval; the quick mode's
    settings unless flags override."""
    cli = pytest.importorskip("rpg_ref.cli")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the flags, not this machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = gb.argparse.Namespace(device="cuda", models=None, out=None, mode=None, prompts=None,
                                 group=None, updates=None, steps=None, max_new_tokens=1024)
    gb.resolve_mode(args)
    assert args.models == ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b"] and args.mode == "quick"
    assert (args.prompts, args.group, args.updates, args.steps, args.max_new_tokens) == (
        4,
        8,
        2,
        2,
        1024,
    )
    cfg = cli.parse_config(gb.train_argv("qwen3-4b", args, tmp_path / "o",
                                          bench_common.model_config("qwen3-4b", tmp_path)))
    assert (cfg.task, cfg.engine, cfg.max_new_tokens, cfg.device) == ("math", "hf", 1024, "cuda")
    assert cfg.prompts_per_step * cfg.group_size // cfg.mini_batch_size == 2
    assert (cfg.micro_batch_size, cfg.micro_batch_tokens) == (0, gb.MICRO_BATCH_TOKENS["qwen3-4b"])
    o = cfg.task_options
    assert (o["dtype"], o["gradient_checkpointing"], o["export"], o["eval_n"]) == (
        "bf16-autocast",
        True,
        False,
        0,
    )
    assert (
        o["model"].endswith("models/qwen3-4b/config.json") and cfg.engine_options["chunk"] == "auto"
    )
    small = cli.parse_config(gb.train_argv("qwen3-0.6b", args, tmp_path / "s",
                                            bench_common.model_config("qwen3-0.6b", tmp_path)))
    assert not small.task_options["gradient_checkpointing"] and small.micro_batch_tokens == 16384
    full = gb.argparse.Namespace(device="cuda", models=None, out=None, mode="full", prompts=None,
                                 group=None, updates=None, steps=None, max_new_tokens=None)
    gb.resolve_mode(full)
    assert (full.steps, full.max_new_tokens) == (3, 2048)
    cpu = gb.argparse.Namespace(device="cpu", models=None, out=None, mode=None, prompts=None,
                                group=None, updates=None, steps=None, max_new_tokens=None)
    gb.resolve_mode(cpu)
    assert (cpu.models, cpu.mode, cpu.steps, cpu.max_new_tokens) == (["qwen3-tiny"], "smoke", 2, 16)
    assert Path(cpu.out).name == "gpu_bench_cpu.json"


# ------------------------------------------------------------------------------------------
# small_scale/bench/gpu_vs_trl.py and the helpers it shares with bench_trainer.py
# ------------------------------------------------------------------------------------------
SETTINGS = {
    "device": "cuda",
    "model": "qwen3-0.6b",
    "prompts": 4,
    "group": 8,
    "updates": 2,
    "max_new_tokens": 256,
    "steps": 4,
    "beta": 1e-4,
    "lr": 1e-6,
    "seed": 0,
}


def test_rollout_cycles_sum_groups_of_optimizer_steps():
    """Timestamps 0 (train begin), 1, 3, 6, 10, 15: optimizer steps of 1, 2, 3, 4, 5 s; rollouts
    of 2 optimizer steps take 3 and 7 s (the unfinished fifth step is not a rollout)."""
    assert bench_common.rollout_cycles([0, 1, 3, 6, 10, 15], 2) == [3, 7]
    assert bench_common.rollout_cycles([0, 1, 3], 1) == [1, 2]
    with pytest.raises(ValueError, match="per_rollout must be >= 1"):
        bench_common.rollout_cycles([0, 1], 0)


def test_ratio_rows_and_headline_ratios_by_hand():
    """Step times [2, 4, 3] (median 3) vs TRL's [9, 12] (median 10.5): 3.5x faster; 6 GiB vs 8 GiB
    peak: 0.75 of TRL's memory."""
    ours, trl = (
        {"step_s": [2.0, 4.0, 3.0], "peak_gib": 6.0},
        {"step_s": [9.0, 12.0], "peak_gib": 8.0},
    )
    r = vs.compare(ours, trl)
    assert (r["speedup_vs_trl"], r["peak_memory_ratio"]) == (3.5, 0.75)
    rows = bench_common.ratio_rows(
        ours, trl, [("step", "step_s", ".1f"), ("mem", "peak_gib", ".0f")]
    )
    assert rows[2:] == ["| step | 3.0 | 10.5 | 0.29 |", "| mem | 6 | 8 | 0.75 |"]


def test_both_trainers_get_the_same_settings(tmp_path, monkeypatch):
    """rpg-train's flags parse into a valid configuration with the benchmark's batch, lengths,
    optimizer steps, bf16 autocast and checkpointing; TRL's config has the same batch (per-device
    batch x steps per generation = prompts x group), group, length, lr, bf16, checkpointing and a
    reference model (beta > 0)."""
    cli = pytest.importorskip("rpg_ref.cli")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the flags, not this machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = cli.parse_config(
        vs.ours_argv(SETTINGS, tmp_path / "o", tmp_path / "m", tmp_path / "p.jsonl")
    )
    assert (cfg.prompts_per_step, cfg.group_size, cfg.max_new_tokens, cfg.lr) == (4, 8, 256, 1e-6)
    assert cfg.prompts_per_step * cfg.group_size // cfg.mini_batch_size == 2
    assert (cfg.task_options["dtype"], cfg.task_options["gradient_checkpointing"]) == (
        "bf16-autocast",
        True,
    )
    t = vs.trl_config(SETTINGS, tmp_path / "t")
    assert t["per_device_train_batch_size"] * t["steps_per_generation"] == 32
    assert (t["num_generations"], t["max_completion_length"], t["learning_rate"]) == (8, 256, 1e-6)
    assert t["bf16"] and t["gradient_checkpointing"] and t["beta"] > 0
    assert t["max_steps"] == SETTINGS["steps"] * SETTINGS["updates"]


@pytest.mark.parametrize(
    "change,msg",
    [
        ({"steps": 1}, "--steps >= 2"),
        ({"beta": 0.0}, "--beta > 0"),
        ({"updates": 3}, "do not split"),
    ],
)
def test_bad_settings_are_refused(change, msg):
    assert msg in vs.check({**SETTINGS, **change}) and vs.check(SETTINGS) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only machine")
def test_gpu_vs_trl_refuses_without_a_gpu(capsys, tmp_path):
    assert vs.main(["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA GPU is available" in err
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------
# both benchmarks end to end on the CPU (--device cpu): the pipeline a GPU session will run
# ------------------------------------------------------------------------------------------
_NEEDED = [data_dir() / "models" / "qwen3-0.6b" / "config.json", data_dir() / "tokenizer" / "qwen3",
           data_dir() / "train" / "deepmath_int.jsonl"]
needs_data = pytest.mark.skipif(
    not all(p.exists() for p in _NEEDED),
    reason=f"shared data absent ({', '.join(str(p) for p in _NEEDED if not p.exists())}): set "
    f"RPG_DATA_DIR to the folder holding models/, tokenizer/ and train/")


@needs_data
def test_gpu_bench_runs_end_to_end_on_cpu(tmp_path, capsys):
    """`gpu_bench.py --device cpu` trains qwen3-tiny for the smoke mode's 2 steps in a child
    process and writes its results file: the command, the CPU as device, the smoke settings, and
    per-step numbers that agree with each other: the measured step's generated tokens
    (gen_tokens_per_s x time_rollout) are the batch's 2 x 2 responses x response_len, and with
    --peak-tflops 0.5 the step MFU is the hand formula (6 N T_train + 2 N T_logprob + 2 N T_gen)
    / (time_step x 0.5e12) on that step's raw metrics."""
    pytest.importorskip("transformers")
    out = tmp_path / "gpu_bench_cpu.json"
    assert gb.main(["--device", "cpu", "--peak-tflops", "0.5", "--out", str(out)]) == 0
    assert "qwen3-tiny:" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["device"].startswith("CPU") and d["mode"] == "smoke" and "--device cpu" in d["command"]
    assert d["settings"] == {
        "steps": 2,
        "prompts": 2,
        "group": 2,
        "updates": 1,
        "max_new_tokens": 16,
    }
    r = d["models"]["qwen3-tiny"]
    assert r["steps_measured"] == 1 and len(r["raw_steps"]) == 2
    step = r["raw_steps"][1]  # the measured one (the first is warm-up)
    assert 1 <= step["response_len"] <= 16
    gen = step["gen_tokens_per_s"] * step["time_rollout"]
    assert gen == pytest.approx(4 * step["response_len"], rel=1e-6)
    n = r["params"]
    trained = step["train_tokens_per_s"] * step["time_update"]
    # one optimizer step, one epoch
    assert trained == pytest.approx(4 * step["response_len"], rel=1e-6)
    flops = 6 * n * trained + 2 * n * 4 * step["response_len"] + 2 * n * gen
    assert r["mfu_step"] == pytest.approx(flops / (step["time_step"] * 0.5e12), rel=1e-9)
    assert r["step_time_s"] == step["time_step"] and r["peak_mem_gib"] > 0


@needs_data
def test_gpu_vs_trl_runs_end_to_end_on_cpu(tmp_path, capsys):
    """`bench_gpu_vs_trl.py --device cpu` runs both trainers on qwen3-tiny, each in its own
    process, at the same settings (TRL with beta > 0 and its reference model), and its headline
    ratios are those of the workers' own measurements: speed-up = median(TRL step seconds) /
    median(rpg-train step seconds), memory = peak RSS ours / TRL's, over the 2 steps after
    warm-up."""
    pytest.importorskip(
        "trl", reason="TRL is the peer of this benchmark: pip install 'rpg-ref[bench]'"
    )
    pytest.importorskip("datasets")
    assert vs.main(["--device", "cpu", "--out", str(tmp_path)]) == 0
    assert "speed-up (TRL step time / ours)" in capsys.readouterr().out
    r = json.loads((tmp_path / "qwen3-tiny-cpu" / "result.json").read_text())
    assert r["settings"]["device"] == "cpu" and r["device"].startswith("CPU")
    assert len(r["ours"]["step_s"]) == len(r["trl"]["step_s"]) == 2
    assert r["speedup_vs_trl"] == statistics.median(r["trl"]["step_s"]) / statistics.median(
        r["ours"]["step_s"]
    )
    assert r["peak_memory_ratio"] == r["ours"]["peak_gib"] / r["trl"]["peak_gib"]
    assert all(t > 0 for t in r["ours"]["step_s"] + r["trl"]["step_s"])


# small_scale/bench/gpu_session.sh: what it carries to the GPU machine and how it refuses
SESSION = Path(__file__).resolve().parent.parent / "small_scale" / "bench" / "gpu_session.sh"


def _bash_array(name: str) -> set:
    """The package names of a bash array ``NAME=(a==1 b ...)`` in gpu_session.sh."""
    import re

    text = SESSION.read_text()
    body = re.search(rf"^{name}=\((.*?)\)", text, re.S | re.M).group(1)
    return {re.split(r"[=<>]", w)[0].lower().replace("_", "-") for w in body.split()}


def test_gpu_session_carries_every_runtime_dependency():
    """Each of pyproject.toml's runtime dependencies is in the GPU image (IMAGE_HAS) or carried as
    a wheel (WHEELS): a dependency added to the project and missing there stops the GPU call at
    its first import."""
    import re

    import tomllib

    deps = tomllib.loads((SESSION.parents[2] / "pyproject.toml").read_text())["project"][
        "dependencies"]
    names = {re.split(r"[\s=<>!~;\[]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}
    missing = names - _bash_array("IMAGE_HAS") - _bash_array("WHEELS")
    assert not missing, f"gpu_session.sh neither has nor carries {sorted(missing)}"


def test_gpu_session_refuses_an_unknown_step():
    """An unknown step: one usage line naming the steps, exit 2, nothing installed."""
    import subprocess

    r = subprocess.run(["bash", str(SESSION), "bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "prepare|all|tests|default|gen" in r.stderr
