"""Reliability of rpg-train: resume, refusals of bad input before anything is written, and a
fault-injection test that kills runs at 20+ random moments (checkpoint writes included).

Runs use the bandit task (no transformers model): seconds per process, bitwise deterministic on CPU.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("safetensors")

from rpg_ref import cli
from rpg_ref.math.data import data_dir
from rpg_ref.trainer import config, presets, run_folder

BANDIT = ["--task", "bandit", "--group-size", "64", "--mini-batch-size", "32", "--no-progress"]
VOLATILE = ("time_", "_per_s", "peak_mem_mb")


def rows(out) -> list:
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def snapshot(folder: Path) -> dict:
    """path -> (bytes, mtime_ns) of every file below ``folder``."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------
# resume
# ------------------------------------------------------------------------------------------


def test_resume_continues_in_the_folder_given_even_after_it_was_moved(tmp_path, monkeypatch):
    """A run written with a relative --out, moved elsewhere and resumed from another working
    directory, continues in the folder given to --resume (steps 3-4 appended after 1-2), and
    nothing is written at the path stored in its config."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    assert cli.main([*BANDIT, "--steps", "2", "--out", "run"]) == 0
    moved = tmp_path / "archive" / "run"
    moved.parent.mkdir()
    shutil.move(str(first / "run"), moved)
    monkeypatch.chdir(second)
    assert cli.main(["--resume", str(moved), "--steps", "4"]) == 0
    assert [r["step"] for r in rows(moved)] == [1, 2, 3, 4]
    assert not (second / "run").exists() and not (first / "run").exists()
    assert json.loads((moved / "summary.json").read_text())["final"]["step"] == 4


def test_resuming_a_finished_run_changes_nothing(tmp_path, capsys):
    """--resume of a run that reached --steps leaves every file byte-identical (and untouched:
    same modification times), says so, and exits 0."""
    out = tmp_path / "o"
    assert cli.main([*BANDIT, "--steps", "3", "--out", str(out)]) == 0
    before = snapshot(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final"]["step"] == 3 and summary["eval"]
    capsys.readouterr()
    assert cli.main(["--resume", str(out)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert snapshot(out) == before


def test_resume_with_fewer_steps_than_reached_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli.main([*BANDIT, "--steps", "3", "--out", str(out)]) == 0
    before = snapshot(out)
    assert cli.main(["--resume", str(out), "--steps", "2"]) == 2
    assert "below the step the run has reached (3)" in capsys.readouterr().err
    assert snapshot(out) == before


def test_resume_refuses_out(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli.main([*BANDIT, "--steps", "1", "--out", str(out)]) == 0
    assert cli.main(["--resume", str(out), "--out", str(tmp_path / "x")]) == 2
    assert "drop --out" in capsys.readouterr().err


def test_resume_drops_metrics_rows_newer_than_the_checkpoint(tmp_path):
    """A run folder whose metrics.jsonl has rows past its latest checkpoint (as a SIGKILL between a
    step's row and its checkpoint leaves it: here rows 4-5, altered, over the checkpoint of step 3)
    resumes from the checkpoint: those rows are dropped and steps 4-5 are computed again, so the
    rows (all but timings and memory) are exactly those of the uninterrupted run."""
    argv = [*BANDIT, "--steps", "5", "--save-every", "3", "--keep-checkpoints", "0"]
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert cli.main([*argv, "--out", str(ref)]) == 0
    assert cli.main([*argv, "--out", str(out)]) == 0
    ck = out / "checkpoints"
    shutil.rmtree(ck / "step_000005")
    (ck / "LATEST").write_text("step_000003")
    (out / "summary.json").unlink()
    stale = rows(out)
    assert [r["step"] for r in stale] == [1, 2, 3, 4, 5]
    for r in stale[3:]:
        r["reward"] = -123.0  # rows that resume must not keep
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stale))
    assert cli.main(["--resume", str(out)]) == 0
    strip = lambda x: {k: v for k, v in x.items() if not any(s in k for s in VOLATILE)}
    assert [strip(x) for x in rows(out)] == [strip(x) for x in rows(ref)]


@pytest.mark.parametrize("keep,expected", [(1, [5]), (2, [4, 5]), (0, [1, 2, 3, 4, 5])])
def test_keep_checkpoints_keeps_the_latest_n(tmp_path, keep, expected):
    """--keep-checkpoints N keeps the latest N checkpoint folders (0 = all); LATEST names the
    last."""
    out = tmp_path / "o"
    argv = [*BANDIT, "--steps", "5", "--save-every", "1", "--out", str(out)]
    assert cli.main([*argv, "--keep-checkpoints", str(keep)]) == 0
    kept = sorted(int(p.name[5:]) for p in (out / "checkpoints").glob("step_*"))
    assert kept == expected
    assert (out / "checkpoints" / "LATEST").read_text() == "step_000005"


# ------------------------------------------------------------------------------------------
# bad input: one line, exit 2, nothing written
# ------------------------------------------------------------------------------------------


def _refused(capsys, argv, out: Path, needle: str) -> str:
    assert cli.main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists(), f"{out} was created by a refused run"
    return err


# every numeric flag: (flags, the words of its rule); non-finite values and values out of range
NUMBERS = [
    (["--lr", "inf"], "--lr must be finite and > 0, got inf"),
    (["--lr", "nan"], "--lr must be finite and > 0, got nan"),
    (["--lr", "0"], "--lr must be finite and > 0, got 0.0"),
    (["--beta", "nan"], "--beta nan: beta must be a finite number >= 0"),
    (["--beta", "-1"], "--beta -1.0: beta must be a finite number >= 0"),
    (["--adam-betas", "1.5", "0.999"], "--adam-betas must be two numbers in [0, 1), got [1.5, "),
    (["--adam-betas", "0.9", "nan"], "--adam-betas must be two numbers in [0, 1)"),
    (["--weight-decay", "inf"], "--weight-decay must be finite and >= 0, got inf"),
    (["--weight-decay", "-0.1"], "--weight-decay must be finite and >= 0"),
    (["--grad-clip", "nan"], "--grad-clip must be finite and >= 0, got nan"),
    (["--grad-clip", "-1"], "--grad-clip must be finite and >= 0"),
    (["--kappa", "nan"], "--kappa must be > 0 (inf: never), got nan"),
    (["--kappa", "0"], "--kappa must be > 0"),
    (["--temperature", "inf"], "--temperature must be finite and > 0, got inf"),
    (["--temperature", "0"], "--temperature must be finite and > 0"),
    (["--top-p", "nan"], "--top-p must be in (0, 1], got nan"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--overlong-penalty", "nan"], "--overlong-penalty must be finite and >= 0, got nan"),
    (["--overlong-penalty", "-1"], "--overlong-penalty must be finite and >= 0"),
    (["--rollout-correction", "tis", "--rollout-correction-cap", "nan"],
     "--rollout-correction-cap: rollout correction cap must be a number >= 1"),
    (["--rollout-correction", "tis", "--rollout-correction-cap", "0.5"],
     "--rollout-correction-cap: rollout correction cap must be a number >= 1"),
    (["--dist-timeout", "inf"], "--dist-timeout must be finite and > 0, got inf"),
    (["--dist-timeout", "0"], "--dist-timeout must be finite and > 0"),
    (["--clip", "0.2", "nan"], "--clip 0.2 nan: clip eps_high must be > 0 and finite"),
    (["--seed", "-1"], "--seed must be an integer in [0, 2^63), got -1"),
    (["--seed", str(2**63)], "--seed must be an integer in [0, 2^63)"),
    (["--init-seed", "-1"], "--init-seed must be an integer in [0, 2^63), got -1"),
    (["--steps", "0"], "--steps must be an integer >= 1, got 0"),
    (["--threads", "-1"], "--threads must be an integer >= 0, got -1"),
    (["--prompts-per-step", "0"], "--prompts-per-step must be an integer >= 1"),
    (["--group-size", "0"], "--group-size must be an integer >= 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1"),
    (["--dynamic-sampling-rounds", "0"], "--dynamic-sampling-rounds must be an integer >= 1"),
    (["--overlong-buffer", "-1"], "--overlong-buffer must be an integer >= 0"),
    (["--overlong-buffer", "2"], "--overlong-buffer must be in [0, --max-new-tokens 1], got 2"),
    (["--sampler-lag", "-1"], "--sampler-lag must be an integer >= 0, got -1"),
    (["--mini-batch-size", "0"], "--mini-batch-size must be an integer >= 1"),
    (["--micro-batch-size", "-1"], "--micro-batch-size must be an integer >= 0"),
    (["--micro-batch-tokens", "-1"], "--micro-batch-tokens must be an integer >= 0"),
    (["--logprob-chunk", "-1"], "--logprob-chunk must be an integer >= 0"),
    (["--updates-per-step", "0"], "--updates-per-step must be an integer >= 1"),
    (["--warmup-steps", "-1"], "--warmup-steps must be an integer >= 0"),
    (["--eval-every", "-1"], "--eval-every must be an integer >= 0"),
    (["--save-every", "0"], "--save-every must be an integer >= 1"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints must be an integer >= 0"),
    (["--bandit-rewards", "1", "nan", "0"], "--bandit-rewards must be finite numbers"),
    (["--bandit-rewards", "1"], "at least 2 arms"),
    (["--bandit-init-scale", "inf"], "--bandit-init-scale must be finite and >= 0, got inf"),
    (["--task", "seq", "--seq-digits", "19"], "--seq-digits must be in [1, 18], got 19"),
    (["--task", "seq", "--seq-warm-lr", "nan"], "--seq-warm-lr must be finite and > 0"),
    (["--task", "seq", "--seq-heads", "0"], "--seq-heads must be in [1, --seq-hidden 128]"),
    (["--task", "seq", "--seq-warm-batch", "0"], "--seq-warm-batch must be >= 1"),
    (["--task", "math", "--math-check-timeout", "nan"], "--math-check-timeout finite and > 0"),
    (["--task", "math", "--math-eval-temperature", "inf"], "--math-eval-temperature finite"),
    (["--task", "math", "--math-eval-max-new-tokens", "-1"], "--math-eval-max-new-tokens must be"),
    (["--engine", "vllm", "--vllm-gpu-memory-utilization", "nan"],
     "--vllm-gpu-memory-utilization must be in (0, 1]"),
    (["--engine", "vllm", "--vllm-verify-tol", "inf"], "--vllm-verify-tol must be >= 0"),
]


@pytest.mark.parametrize("flags,needle", NUMBERS, ids=[" ".join(f) for f, _ in NUMBERS])
def test_numeric_flag_out_of_range_is_refused_naming_the_flag(tmp_path, capsys, flags, needle):
    """Every numeric flag refuses inf / nan and values out of its range: one line naming the flag
    and its rule, exit code 2, and OUT never created (the bandit preset, one token per response)."""
    _refused(capsys, [*BANDIT, *flags], tmp_path / "o", needle)


def test_numeric_flags_accept_their_extremes(tmp_path):
    """inf where a flag's rule allows it (no KL early stop, no cap, no dual bound), a huge finite
    lr, and the largest seed: accepted, as typed."""
    cfg = cli.parse_config([*BANDIT, "--kappa", "inf", "--rollout-correction", "tis",
                            "--rollout-correction-cap", "inf", "--clip", "0.2", "0.28", "inf",
                            "--lr", "1e38", "--seed", str(2**63 - 1), "--out", str(tmp_path / "o")])
    assert (cfg.kappa, cfg.rollout_correction_cap, cfg.clip[2], cfg.lr, cfg.seed) == (
        float("inf"), float("inf"), float("inf"), 1e38, 2**63 - 1)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_device_without_cuda_is_refused_before_anything_is_written(tmp_path, capsys, device):
    _refused(capsys, [*BANDIT, "--device", device], tmp_path / "o", "CUDA is not available here")


def test_unknown_device_is_refused(tmp_path, capsys):
    _refused(
        capsys, [*BANDIT, "--device", "gpu0"], tmp_path / "o", "is not cpu, cuda, cuda:N or auto"
    )


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "o"
    f.write_text("not a folder")
    assert cli.main([*BANDIT, "--out", str(f)]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert f.read_text() == "not a folder"


MATH_NEEDED = [
    data_dir() / "models" / "qwen3-0.6b" / "config.json",
    data_dir() / "tokenizer" / "qwen3",
]
needs_math_data = pytest.mark.skipif(
    not all(p.exists() for p in MATH_NEEDED),
    reason=f"shared data absent ({data_dir()}): set RPG_DATA_DIR to the folder holding models/ "
           "and tokenizer/",
)


def _math(train_data: str, model: str | None = None) -> list:
    return [
        "--task",
        "math",
        "--math-model",
        model or str(MATH_NEEDED[0]),
        "--math-train-data",
        train_data,
        "--math-eval-n",
        "0",
        "--steps",
        "1",
        "--prompts-per-step",
        "2",
        "--group-size",
        "2",
        "--mini-batch-size",
        "2",
        "--max-new-tokens",
        "4",
        "--math-dtype",
        "float32",
        "--no-math-gradient-checkpointing",
        "--micro-batch-size",
        "0",
        "--device",
        "cpu",
        "--no-progress",
        "--overlong-buffer",
        "0",
        "--no-dynamic-sampling",
    ]


@needs_math_data
@pytest.mark.parametrize(
    "content,needle",
    [
        (None, "does not exist"),
        (
            '{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": \n',
            "train.jsonl:2: invalid JSON",
        ),
        ('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?"}\n', "answer"),
    ],
)
def test_bad_math_train_data_is_refused_before_anything_is_written(
    tmp_path, capsys, content, needle
):
    """A missing file, a broken JSONL line, a row without an answer: one line naming
    --math-train-data, exit 2, no output folder (so a corrected rerun into it is not refused)."""
    data = tmp_path / "train.jsonl"
    if content is not None:
        data.write_text(content)
    err = _refused(capsys, _math(str(data)), tmp_path / "o", needle)
    assert "--math-train-data" in err


@needs_math_data
def test_unreachable_hub_model_is_refused_quickly(tmp_path):
    """A hub id that is not in the local cache, with the hub unreachable, is refused in seconds
    (one connection attempt, not download retries): one line, exit 2, nothing written."""
    good = tmp_path / "train.jsonl"
    good.write_text("".join(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(4)))
    out = tmp_path / "o"
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_OFFLINE": "0", "PYTHONWARNINGS": "ignore"}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "rpg_ref.cli", *_math(str(good), "someorg/somemodel"),
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    elapsed = time.monotonic() - t0
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip()
    assert "--math-model 'someorg/somemodel'" in err and "cannot be reached" in err, err
    assert len(err.splitlines()) == 1, err
    assert not out.exists()
    assert elapsed < 60, (
        f"took {elapsed:.0f} s: the hub was retried instead of detected unreachable"
    )


# ------------------------------------------------------------------------------------------
# first run: --help shows what will run; tests do not see the working directory's runs
# ------------------------------------------------------------------------------------------


def test_help_shows_the_values_the_default_run_uses():
    """For every value the default preset sets, --help shows that value, not the dataclass's."""
    text = " ".join(cli.help_text().replace("│", " ").split())  # without tyro's box
    preset = presets.PRESETS[presets.DEFAULT_PRESET]
    assert "The defaults shown are what runs with no flags: the preset 'seq'" in text
    for key, value in preset.items():
        flag = "--" + key.replace("_", "-")
        after = text[text.rindex(flag + " "):]
        shown = " ".join(map(str, value)) if isinstance(value, list) else value
        assert f"(default: {shown})" in after[:600], key
    # most of them differ from the dataclass's defaults: the help shows the preset's own
    assert sum(value != config.DEFAULTS[key] for key, value in preset.items()) >= 6
    cfg = cli.parse_config([])
    for key, value in preset.items():
        assert getattr(cfg, key) == value, key


def test_a_run_left_in_the_working_directory_does_not_change_the_default_config(tmp_path):
    """The README's main job writes runs/<task>-<algo>-s0 in the checkout; the test suite then runs
    in the same checkout. Every test runs in a fresh working directory (tests/conftest.py), so a
    default-config parse here does not see a run folder that exists in the checkout."""
    cfg = cli.parse_config([])
    assert not (Path.cwd() / cfg.out).exists()
    assert Path.cwd() != Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------
# fault injection: SIGKILL at 20+ moments, checkpoint writes included
# ------------------------------------------------------------------------------------------

# A child process that SIGKILLs itself at the k-th of the operations a run performs: each write of
# a checkpoint (safetensors, torch.save, renames, deletions, LATEST), each metrics row, each rollout
# and each update. It appends the name of the operation it died in to RPG_TEST_KILL_LOG.
KILLER = r"""
import os, shutil, signal, sys
import safetensors.torch, torch
import rpg_ref.trainer.checkpoint as ck, rpg_ref.trainer.metrics as mt, rpg_ref.trainer.train as tr
k, n = int(os.environ["RPG_TEST_KILL_AT"]), [0]
def wrap(owner, name):
    f = getattr(owner, name)
    def g(*a, **kw):
        n[0] += 1
        if n[0] == k:
            with open(os.environ["RPG_TEST_KILL_LOG"], "a") as log:
                log.write(name + "\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return f(*a, **kw)
    setattr(owner, name, g)
for owner, name in [(safetensors.torch, "save_model"), (torch, "save"), (os, "replace"),
                    (shutil, "rmtree"), (ck, "atomic_write"), (tr, "atomic_write"), (tr, "rollout"),
                    (tr, "update"), (mt.MetricsLog, "write")]:
    wrap(owner, name)
from rpg_ref.cli import main
sys.exit(main(sys.argv[1:]))
"""
CHECKPOINT_OPS = {"save_model", "save", "replace", "rmtree", "atomic_write"}


def _child(argv, kill_at: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "RPG_TEST_KILL_AT": str(kill_at), "RPG_TEST_KILL_LOG": str(log)}
    return subprocess.Popen([sys.executable, "-c", KILLER, *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigkill_at_twenty_random_moments_then_resume_is_bitwise_identical(tmp_path):
    """A bandit run with --ref init, a checkpoint every step and two kept, is SIGKILLed again and
    again: 20+ times, each at a random moment (the k-th checkpoint write, metrics row, rollout or
    update, k random; a few by the parent after a random delay, wherever the run is), and resumed
    each time (rerun from scratch if it died before its config.json existed). Every chain ends with
    exactly the metrics (all but timings and memory) and bitwise the weights, reference weights and
    optimizer state of an uninterrupted run, and with no temporary file of a killed writer left."""
    from safetensors.torch import load_file

    rng, log, kills, chains = random.Random(20261122), tmp_path / "kills.log", 0, 0
    while kills < 20:
        chains += 1
        argv = [*BANDIT, "--steps", "24", "--save-every", "1", "--keep-checkpoints", "2", "--ref",
                "init", "--seed", str(chains)]
        ref, out = tmp_path / f"ref{chains}", tmp_path / f"run{chains}"
        assert cli.main([*argv, "--out", str(ref)]) == 0
        for _ in range(200):  # a bound, never reached: each chain advances
            cmd = (
                ["--resume", str(out)]
                if (out / "config.json").exists()
                else [*argv, "--out", str(out)]
            )
            if kills >= 20:
                p = _child(cmd, 0, log)  # no kill: finish the chain
            elif rng.random() < 0.2:  # the parent kills after a random delay
                p = _child(cmd, 0, log)
                time.sleep(rng.uniform(0.5, 6.0))
                p.send_signal(signal.SIGKILL)
            else:
                p = _child(cmd, rng.randint(1, 40), log)
            rc = p.wait(timeout=300)
            if rc == -signal.SIGKILL:
                kills += 1
                continue
            assert rc == 0, p.stderr.read()
            if json.loads((out / "summary.json").read_text())["final"]["step"] == 24:
                break
        strip = lambda x: {k: v for k, v in x.items() if not any(s in k for s in VOLATILE)}
        assert [strip(x) for x in rows(out)] == [strip(x) for x in rows(ref)]
        # what the killed writers left (temp folders, temp files) went when a resume took the lock
        assert run_folder.leftovers(out) == [] and not (out / run_folder.LOCK).exists()
        ca, cb = ref / "checkpoints" / "step_000024", out / "checkpoints" / "step_000024"
        for f in ("model.safetensors", "ref.safetensors"):
            ta, tb = load_file(ca / f), load_file(cb / f)
            assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), f
        oa, ob = torch.load(ca / "optimizer.pt"), torch.load(cb / "optimizer.pt")
        for i in oa["state"]:
            for k in oa["state"][i]:
                assert torch.equal(oa["state"][i][k], ob["state"][i][k]), f"optimizer {i}.{k}"
    where = log.read_text().split() if log.exists() else []
    assert kills >= 20
    assert sum(w in CHECKPOINT_OPS for w in where) >= 5, (
        f"too few kills inside checkpoint writes: {where}"
    )
