"""rpg-train's command line as a user meets it: usage errors, messages, --help, the default output
folder, Ctrl-C / SIGTERM, and the run files (strict JSON) that rpg-plot draws."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import sigint_as_in_a_terminal

from rpg_ref import cli, strict_json
from rpg_ref.core.losses import LOSSES

REPO = Path(__file__).resolve().parent.parent


def _run(argv, capsys) -> tuple[int, list[str]]:
    rc = cli.main(argv)
    return rc, capsys.readouterr().err.strip().splitlines()


# ------------------------------------------------------------------------------------------
# usage errors and messages
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--no-such-flag"], ["--steps", "ten"], ["--steps"],
                                  ["--step", "10"]])
def test_usage_error_is_two_lines_naming_the_mistake_and_help(argv, capsys):
    """An unknown flag, a mistyped value, a missing value and an abbreviated flag (`--step` for
    `--steps`, refused: allow_abbrev=False) each give exit code 2 and two lines on stderr: what
    was wrong, then `rpg-train --help`; no usage dump, nothing written."""
    rc, err = _run(argv, capsys)
    assert rc == 2
    assert len(err) == 2, err
    assert argv[0] in err[0], err
    assert "rpg-train --help" in err[1]
    assert not any(line.startswith("usage:") for line in err)
    assert not Path("runs").exists()


def test_usage_error_in_a_utf8_terminal_is_two_lines(tmp_path):
    """tyro draws its error in a box (UTF-8 lines where stdout is UTF-8, wrapped at the terminal's
    width): rpg-train still says it in two lines, the first naming the flag, exit code 2."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8", COLUMNS="40",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "rpg_ref.cli", "--max-new-tokens", "ten"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 2, p.stderr
    assert err[0].startswith("rpg-train: Error parsing --max-new-tokens: invalid literal"), err
    assert "│" not in p.stderr and not (tmp_path / "runs").exists()


def test_missing_vllm_is_one_line_before_anything_is_written(capsys):
    """`--engine vllm` where vLLM is not installed: exit code 2, one line naming the install, and
    nothing written (not even the seq task's warm-start cache, which the task builds first)."""
    import importlib.util
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment (its own tests run the engine)")
    rc, err = _run(["--engine", "vllm", "--steps", "2"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "needs vLLM" in err[0] and "pip install" in err[0]
    assert not Path("runs").exists()


def test_steps_zero_names_the_steps_flag_only(capsys):
    """`--steps 0` is refused naming --steps, and no other field (max_new_tokens) is blamed."""
    rc, err = _run(["--steps", "0"], capsys)
    assert rc == 2 and len(err) == 1
    assert "--steps must be an integer >= 1, got 0" in err[0]
    assert "max_new_tokens" not in err[0] and "max-new-tokens" not in err[0]


def test_message_names_flags_and_the_preset_a_value_came_from(capsys):
    """With `--task math --max-new-tokens 100` the math preset's overlong buffer (512) no longer
    fits: the message names the flag (--overlong-buffer, not the field overlong_buffer) and says
    that its value came from the preset; the value given on the command line is not blamed on it."""
    rc, err = _run(["--task", "math", "--max-new-tokens", "100"], capsys)
    assert rc == 2 and len(err) == 1
    assert "--overlong-buffer" in err[0] and "overlong_buffer" not in err[0]
    assert "--overlong-buffer 512 came from --preset math" in err[0]
    assert "--max-new-tokens 100 came from" not in err[0]


def test_help_lists_every_algorithm(capsys):
    """`rpg-train --help` exits 0 and names every loss --algo accepts, each whole on one line (the
    help is wrapped at spaces, never inside a hyphenated name)."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    words = {w.strip(",.;:()") for w in capsys.readouterr().out.split()}
    missing = [name for name in LOSSES if name not in words]
    assert not missing, missing


# ------------------------------------------------------------------------------------------
# the default output folder
# ------------------------------------------------------------------------------------------


def test_default_out_is_unique_per_configuration():
    """No flags: runs/seq-rpg-reinforce-urkl-s0. --algo and --seed are in the name. Any other flag
    that changes a value adds a short hash: two configurations never share a folder, the order of
    the flags does not matter, a flag equal to the preset's value changes nothing, and presets of
    the same task get their own names."""
    out = lambda *argv: cli.parse_config(list(argv)).out
    assert out() == "runs/seq-rpg-reinforce-urkl-s0"
    assert out("--algo", "grpo", "--seed", "3") == "runs/seq-grpo-s3"
    assert out("--steps", "80") == out()  # the seq preset's own value
    assert out("--progress") == out()  # never changes what a run computes
    a = out("--steps", "5", "--lr", "0.001")
    assert a.startswith("runs/seq-rpg-reinforce-urkl-s0-") and len(a.rsplit("-", 1)[1]) == 6
    assert out("--lr", "0.001", "--steps", "5") == a
    others = {
        a,
        out("--steps", "5"),
        out("--steps", "6"),
        out("--lr", "0.001"),
        out("--seq-digits", "3"),
        out("--clip", "0.2", "0.28"),
        out("--no-clip"),
        out("--beta", "0.01"),
        out("--sampler-lag", "1"),
        out("--init-seed", "5"),
    }
    assert len(others) == 10, others
    assert out("--beta", "0.001") == out()  # the KL coefficient beta defaults to
    assert out("--preset", "bandit") == "runs/bandit-rpg-reinforce-urkl-s0"
    assert out("--task", "bandit") == "runs/bandit-rpg-reinforce-urkl-s0"


# ------------------------------------------------------------------------------------------
# Config from Python = the command line's
# ------------------------------------------------------------------------------------------


def test_config_from_python_is_the_command_lines():
    """A Config built from Python is the one rpg-train builds from the same values: the beta of a
    loss with no KL term (dapo) is 0 both ways, 1e-3 for the others; a preset's beta gives way to
    such a loss (bandit: 0.5 -> 0 for dapo) while a beta given with it is refused; the task's and
    engine's options are filled and checked the same way."""
    from rpg_ref.trainer.config import Config, from_preset
    from rpg_ref.trainer.presets import PRESETS

    seq = {**PRESETS["seq"], "preset": "seq"}
    assert Config(algo="dapo").beta == cli.parse_config(["--algo", "dapo"]).beta == 0.0
    assert Config(algo="grpo").beta == cli.parse_config(["--algo", "grpo"]).beta == 1e-3
    assert cli.parse_config(["--preset", "bandit", "--algo", "dapo"]).beta == 0.0
    assert cli.parse_config(["--preset", "bandit", "--algo", "rpg-rkl"]).beta == 0.5
    with pytest.raises(ValueError, match="dapo has no KL term"):
        cli.parse_config(["--preset", "bandit", "--algo", "dapo", "--beta", "0.5"])
    with pytest.raises(ValueError, match="dapo has no KL term"):
        Config(**{**PRESETS["bandit"], "algo": "dapo"})
    drop_out = lambda cfg: {**dataclasses.asdict(cfg), "out": None}
    for argv, values in [
        ([], {}),
        (["--algo", "dapo"], {"algo": "dapo"}),
        (["--algo", "reinforce++", "--beta", "0.01"], {"algo": "reinforce++", "beta": 0.01}),
        (["--no-clip", "--seq-digits", "3", "--hf-chunk", "4"],
         {"no_clip": True, "seq_digits": 3, "hf_chunk": "4"}),
        (["--preset", "bandit", "--ref", "init", "--bandit-rewards", "1", "0"],
         {"preset": "bandit", "ref": "init", "bandit_rewards": [1.0, 0.0]}),
        (["--task", "math", "--preset", "math-cpu", "--math-eval-k", "2"],
         {"task": "math", "preset": "math-cpu", "math_eval_k": [2]}),
    ]:
        cfg = cli.parse_config(argv)
        assert drop_out(cfg) == drop_out(from_preset(**values)), argv
    direct = Config(**{**seq, "algo": "rpg-rkl", "no_clip": True, "clip": None},
                    task_options={"digits": 3})
    assert drop_out(direct) == drop_out(
        cli.parse_config(["--algo", "rpg-rkl", "--no-clip", "--seq-digits", "3"]))


def test_a_config_json_without_the_newer_fields_resumes(tmp_path, capsys):
    """A run folder whose config.json has no sampler_lag and no init_seed (fields with defaults)
    resumes with their defaults; once a run exists, --sampler-lag and --init-seed are part of its
    identity: a different value is refused on resume."""
    from rpg_ref.strict_json import dumps, loads

    out = tmp_path / "run"
    argv = ["--preset", "bandit", "--steps", "2", "--group-size", "32", "--mini-batch-size", "32",
            "--no-progress", "--out", str(out)]
    stored = dataclasses.asdict(cli.parse_config(argv))
    del stored["sampler_lag"], stored["init_seed"]
    out.mkdir()
    (out / "config.json").write_text(dumps(stored, indent=1))
    assert cli.main(["--resume", str(out), "--steps", "3", "--no-progress"]) == 0
    summary = loads((out / "summary.json").read_text())
    assert summary["config"]["sampler_lag"] == 0 and summary["config"]["init_seed"] is None
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [
        1, 2, 3]
    for flag, value in (("--sampler-lag", "1"), ("--init-seed", "5")):
        with pytest.raises(ValueError, match="flags differ from the stored run's config"):
            cli.parse_config(["--resume", str(out), flag, value])


# ------------------------------------------------------------------------------------------
# interrupts: a real process, a real signal
# ------------------------------------------------------------------------------------------


def _start(argv: list, cwd: Path, script: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    entry = [str(script)] if script else ["-m", "rpg_ref.cli"]
    return subprocess.Popen([sys.executable, *entry, *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_in_a_terminal)


def _wait_for_rows(p: subprocess.Popen, metrics: Path, n: int, limit_s: float = 600) -> None:
    t0 = time.monotonic()
    while not (metrics.is_file() and metrics.read_text().count("\n") >= n):
        assert p.poll() is None, f"run ended before step {n}: {p.communicate()}"
        assert time.monotonic() - t0 < limit_s, f"no step {n} within {limit_s} s"
        time.sleep(0.05)


# a bandit run: many cheap steps, and a process that starts without importing transformers
BANDIT = ["--task", "bandit", "--group-size", "16", "--mini-batch-size", "16", "--no-progress"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_ends_with_one_line_and_the_resume_command(sig, tmp_path):
    """SIGINT (Ctrl-C) or SIGTERM in the middle of a run: exit code 130 / 143, no traceback, one
    line on stderr naming the signal, the step reached, the checkpoint saved and the exact
    `rpg-train --resume DIR` command; that command then finishes the run."""
    out = tmp_path / "run"
    p = _start([*BANDIT, "--steps", "100000", "--save-every", "3", "--out", str(out)], tmp_path)
    _wait_for_rows(p, out / "metrics.jsonl", 4)
    p.send_signal(sig)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 128 + sig, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"interrupted ({signal.Signals(sig).name}) after step " in lines[0]
    done = int(lines[0].split("after step ")[1].split()[0])
    saved = int((out / "checkpoints" / "LATEST").read_text().strip().removeprefix("step_"))
    # the step's row and checkpoint are written together: the cadence's (every 3 steps) last one
    assert done >= 4 and saved == done - done % 3, (done, saved, lines[0])
    assert f"checkpoint of step {saved}" in lines[0]
    assert lines[0].endswith(f"continue with: rpg-train --resume {out}")
    p = _start(["--resume", str(out), "--steps", str(done + 2), "--no-progress"], tmp_path)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, done + 3))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_a_checkpoint_write_waits_for_the_checkpoint(sig, tmp_path, capsys,
                                                                   monkeypatch):
    """A signal that arrives while step 3's checkpoint is being written (sent from inside the
    write of its weights) lets the step end: its checkpoint is complete (its weights and optimizer
    state are those of an uninterrupted run's step 3), the metrics rows stop at step 3 as well,
    and the run then ends with the one line naming step 3 and the checkpoint of step 3."""
    import safetensors.torch
    import torch

    argv = [*BANDIT, "--steps", "6", "--save-every", "3", "--keep-checkpoints", "0"]
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert cli.main([*argv, "--out", str(ref)]) == 0
    save_model = safetensors.torch.save_model

    def interrupted_save_model(model, path, *a, **kw):
        os.kill(os.getpid(), sig)  # delivered before kill returns
        return save_model(model, path, *a, **kw)

    monkeypatch.setattr(safetensors.torch, "save_model", interrupted_save_model)
    # Ctrl-C's handler, even in a suite started with SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        capsys.readouterr()
        rc, err = _run([*argv, "--out", str(out)], capsys)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert rc == 128 + sig and len(err) == 1, err
    assert f"interrupted ({signal.Signals(sig).name}) after step 3 of 6; saved: checkpoint of " \
           f"step 3 " in err[0], err
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [
        1, 2, 3]
    ck, ck_ref = out / "checkpoints", ref / "checkpoints" / "step_000003"
    assert (ck / "LATEST").read_text() == "step_000003"
    assert sorted(p.name for p in ck.iterdir()) == ["LATEST", "step_000003"]  # no temp folder
    assert json.loads((ck / "step_000003" / "state.json").read_text())["step"] == 3
    a = safetensors.torch.load_file(ck / "step_000003" / "model.safetensors")
    b = safetensors.torch.load_file(ck_ref / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa = torch.load(ck / "step_000003" / "optimizer.pt")["state"]
    ob = torch.load(ck_ref / "optimizer.pt")["state"]
    assert all(torch.equal(oa[i][k], ob[i][k]) for i in ob for k in ob[i])


# the run sends itself SIGTERM once step 2's row is written: the signal lands before the first
# checkpoint whatever the machine's load (a signal sent from outside could come after the end)
SIGTERM_AFTER_STEP_2 = r"""
import os, signal, sys
from rpg_ref.trainer.metrics import MetricsLog
write = MetricsLog.write
def write_then_stop(self, row):
    write(self, row)
    if row["step"] == 2:
        os.kill(os.getpid(), signal.SIGTERM)
MetricsLog.write = write_then_stop
from rpg_ref.cli import main
from rpg_ref.trainer.distributed.setup import exit_process
exit_process(main(sys.argv[1:]))
"""


def test_run_interrupted_before_its_first_checkpoint_restarts_with_the_same_command(tmp_path):
    """A run stopped (SIGTERM) before its first checkpoint says that nothing is saved yet; the same
    command then starts it again from step 1 (its config.json does not block it) and finishes."""
    out, script = tmp_path / "run", tmp_path / "stopped_after_step_2.py"
    script.write_text(SIGTERM_AFTER_STEP_2)
    argv = [*BANDIT, "--steps", "400", "--save-every", "1000", "--out", str(out)]
    p = _start(argv, tmp_path, script)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 143 and "Traceback" not in err, err
    assert "no checkpoint yet" in err and f"rpg-train --resume {out}" in err
    p = _start(argv, tmp_path)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 401))


# ------------------------------------------------------------------------------------------
# run files: strict JSON; rpg-plot
# ------------------------------------------------------------------------------------------


def _strict(text: str):
    """json.loads that refuses the bare Infinity / NaN words (as JavaScript or jq would)."""
    def refuse(word):
        raise ValueError(f"non-standard JSON constant {word}")
    return json.loads(text, parse_constant=refuse)


def test_strict_json_round_trip():
    """Non-finite floats, nested in dicts and lists, are written as "inf" / "-inf" / "nan" (strict
    JSON) and read back as the same floats; finite floats round-trip exactly."""
    obj = {"a": math.inf, "b": [-math.inf, 0.1, {"c": math.nan}], "d": "text", "e": 1e-300}
    text = strict_json.dumps(obj)
    assert _strict(text) == {"a": "inf", "b": ["-inf", 0.1, {"c": "nan"}], "d": "text", "e": 1e-300}
    back = strict_json.loads(text)
    assert back["a"] == math.inf and back["b"][0] == -math.inf and math.isnan(back["b"][2]["c"])
    assert back["b"][1] == 0.1 and back["d"] == "text" and back["e"] == 1e-300


def test_run_files_are_strict_json_and_resume_reads_them(tmp_path, capsys):
    """A bandit run (kappa = inf, a non-finite config value) writes config.json, summary.json,
    metrics.jsonl and the checkpoint's state.json in strict JSON; --resume reads the config back
    with kappa = inf and extends the run."""
    out = tmp_path / "run"
    assert cli.main(["--preset", "bandit", "--steps", "3", "--save-every", "2", "--no-progress",
                     "--out", str(out)]) == 0
    files = [out / "config.json", out / "summary.json",
             *sorted((out / "checkpoints").glob("step_*/state.json"))]
    for f in files:
        _strict(f.read_text())
    for line in (out / "metrics.jsonl").read_text().splitlines():
        _strict(line)
    assert _strict((out / "config.json").read_text())["kappa"] == "inf"
    assert cli.main(["--resume", str(out), "--steps", "4", "--no-progress"]) == 0
    assert strict_json.loads((out / "summary.json").read_text())["config"]["kappa"] == math.inf


def test_rpg_plot_draws_runs_and_prints_the_final_table(tmp_path, capsys):
    """rpg-plot on two runs writes a PNG of a readable size (the six panels), and prints one table
    row per run with its final step and last metrics (taken from its metrics.jsonl) and the last
    evaluation; a folder that is not a run is one line and exit code 2."""
    pytest.importorskip("matplotlib")
    from rpg_ref import plot

    runs = []
    for i, lr in enumerate(("0.05", "0.2")):
        runs.append(tmp_path / f"bandit-{i}")
        assert cli.main(["--preset", "bandit", "--steps", "6", "--lr", lr, "--eval-every", "3",
                         "--no-progress", "--out", str(runs[-1])]) == 0
    capsys.readouterr()
    png = tmp_path / "cmp.png"
    assert plot.main([*map(str, runs), "--out", str(png)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    h, w = matplotlib.image.imread(png).shape[:2]
    assert w >= 1200 and h >= 700, (w, h)
    for run in runs:
        last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        row = next(line.split() for line in table if line.startswith(run.name + " "))
        assert row[1] == "6" and row[2] == f"{last['reward']:.4g}", row
    assert plot.main([str(tmp_path / "nope"), "--out", str(png)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]


def test_rpg_figs_on_rpg_train_runs_names_the_rpg_plot_command(tmp_path, capsys):
    """`rpg-figs --logs runs/` (rpg-train output folders, not small_scale logs) is one line, exit
    code 2, naming the rpg-plot command for those runs; nothing is drawn."""
    pytest.importorskip("matplotlib")
    from paper_figs.__main__ import main as figs_main

    for name in ("a", "b"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    assert figs_main(["--logs", str(tmp_path / "runs"), "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rpg-plot" in err[0], err
    assert str(tmp_path / "runs" / "a") in err[0] and str(tmp_path / "runs" / "b") in err[0]
    assert not (tmp_path / "figs").exists()


def test_rpg_plot_tells_a_run_with_no_step_yet_from_a_wrong_folder(tmp_path, capsys):
    """rpg-plot on a run folder with no completed step: one line (exit 2) saying which it is, a run
    still setting up (its warm start) or before its first step while another process holds the
    folder, or a run stopped before its first step (with its --resume command); a folder that is
    no run is still told to pass rpg-train output folders."""
    pytest.importorskip("matplotlib")
    from rpg_ref import plot

    def said(folder) -> str:
        assert plot.main([str(folder), "--out", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        return err[0]

    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom rpg_ref.trainer import run_folder\n"
         "run_folder.claim(sys.argv[1]); print('held', flush=True); time.sleep(120)", str(run)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        line = said(run)
        assert "run that is running, still setting up (building its policy: a warm start" in line
        (run / "config.json").write_text("{}")
        assert "an rpg-train run that is running, before its first step" in said(run)
    finally:
        holder.kill()
        holder.wait()
    line = said(run)
    assert "stopped before completing a step" in line and f"rpg-train --resume {run}" in line
    (tmp_path / "empty").mkdir()
    assert "no metrics.jsonl in it (pass rpg-train output folders" in said(tmp_path / "empty")
