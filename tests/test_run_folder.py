"""A run folder no one can corrupt: one writer (rpg_ref/trainer/run_folder.py), verified
checkpoints and their fallback (rpg_ref/trainer/checkpoint.py), continuous metric rows, a full
disk, leftovers of killed writers, and runs whose values stop being finite (rpg_ref/trainer/
metrics.py). Every failure is one line.

Runs use the bandit task (1 thread, a constant learning rate: a run resumed from an older
checkpoint recomputes bitwise the same rows); the lock tests start real rpg-train processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import sigint_as_in_a_terminal

pytest.importorskip("safetensors")

from rpg_ref import cli
from rpg_ref.trainer import checkpoint, errors, metrics, run_folder, sampler_lag

BANDIT = ["--task", "bandit", "--group-size", "64", "--mini-batch-size", "32", "--no-progress",
          "--threads", "1", "--lr-decay", "constant"]
VOLATILE = ("time_", "_per_s", "peak_mem_mb", "eval_")  # eval_: the last step's, here or not
REPO = Path(__file__).resolve().parents[1]


def rows(out) -> list:
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def steps(out) -> list:
    return [r["step"] for r in rows(out)]


def strip(rs: list) -> list:
    return [{k: v for k, v in r.items() if not any(s in k for s in VOLATILE)} for r in rs]


def one_line(err: str) -> str:
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_process_left():
    """A failing test leaves no run going (the lock tests start runs of 100000 steps)."""
    yield
    for p in STARTED:
        if p.poll() is None:
            p.kill()
            p.wait()
    STARTED.clear()


def rpg_train(argv: list) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "rpg_ref.cli", *argv],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    STARTED.append(p)
    return p


def wait_for(cond, p: subprocess.Popen | None = None, timeout: float = 300) -> None:
    t0 = time.time()
    while not cond():
        assert p is None or p.poll() is None, p.stderr.read() if p else ""
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.05)


def latest(out: Path) -> str:
    try:
        return (out / "checkpoints" / "LATEST").read_text().strip()
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------
# one writer per folder
# ------------------------------------------------------------------------------------------


LONG = ["--steps", "100000", "--save-every", "1"]  # still going whatever the load: stopped below


def stop(p: subprocess.Popen) -> None:
    """SIGTERM a run that is still going (it ends cleanly, exit code 143)."""
    assert p.poll() is None, p.stderr.read()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=300) == 128 + signal.SIGTERM, p.stderr.read()


def test_two_runs_started_together_one_writes_the_other_is_refused(tmp_path):
    """Two rpg-train into one --out started at the same moment: one is refused (exit 2) with one
    line naming the other's PID; the other runs on (stopped here by SIGTERM) with rows 1..N, each
    once."""
    out = tmp_path / "same"
    ps = [rpg_train([*BANDIT, *LONG, "--out", str(out)]) for _ in range(2)]
    wait_for(lambda: any(p.poll() is not None for p in ps))
    loser = next(p for p in ps if p.poll() is not None)
    winner = next(p for p in ps if p is not loser)
    assert loser.returncode == 2
    assert f"in use by another rpg-train (PID {winner.pid} on" in one_line(loser.stderr.read())
    wait_for(lambda: latest(out) >= "step_000003", winner)
    stop(winner)
    assert steps(out) == list(range(1, len(rows(out)) + 1)) and len(rows(out)) >= 3


def test_a_second_run_3_s_later_is_refused_and_changes_nothing(tmp_path):
    """A second run with another seed and learning rate, 3 s after the first: refused in one line
    naming the first's PID, whatever the first has written by then; the first keeps its config
    and its rows 1..N."""
    out = tmp_path / "run"
    first = rpg_train([*BANDIT, *LONG, "--out", str(out)])
    time.sleep(3)
    second = rpg_train([*BANDIT, *LONG, "--seed", "7", "--lr", "0.1", "--out", str(out)])
    assert second.wait(timeout=300) == 2
    assert f"(PID {first.pid} on" in one_line(second.stderr.read())
    wait_for(lambda: latest(out) >= "step_000003", first)
    stop(first)
    stored = json.loads((out / "config.json").read_text())
    assert stored["seed"] == 0 and stored["lr"] == 0.05
    assert steps(out) == list(range(1, len(rows(out)) + 1))


def test_resume_of_a_live_run_is_refused(tmp_path):
    """--resume of a run that is still going: one line naming its PID, exit 2; the live run's rows
    stay 1..N, each once."""
    out = tmp_path / "run"
    live = rpg_train([*BANDIT, *LONG, "--out", str(out)])
    wait_for(lambda: latest(out) >= "step_000002", live)
    second = rpg_train(["--resume", str(out), "--steps", "200000"])
    assert second.wait(timeout=300) == 2
    assert f"(PID {live.pid} on" in one_line(second.stderr.read())
    stop(live)
    assert steps(out) == list(range(1, len(rows(out)) + 1))


def test_kill_9_releases_the_folder_and_resume_cleans_leftovers(tmp_path):
    """SIGKILL of a run: the lock goes with the process (the resume is not refused), the
    temporary files of dead writers are removed once the lock is held, and the resumed run's rows
    are exactly 1..N."""
    out = tmp_path / "run"
    p = rpg_train([*BANDIT, *LONG, "--out", str(out)])
    wait_for(lambda: latest(out) >= "step_000005", p)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    ck = out / "checkpoints"
    planted = [ck / ".tmp_step_000099_4242", ck / ".LATEST.tmp4242", out / ".config.json.tmp4242",
               out / ".metrics.jsonl.tmp4242"]
    planted[0].mkdir()
    (planted[0] / "model.safetensors").write_bytes(b"x" * 1000)
    for f in planted[1:]:
        f.write_text("left by a writer that died")
    n = checkpoint.latest_step(out) + 3
    assert cli.main(["--resume", str(out), "--steps", str(n)]) == 0
    assert not run_folder.leftovers(out) and not any(f.exists() for f in planted)
    assert steps(out) == list(range(1, n + 1))
    assert not (out / run_folder.LOCK).exists()  # a run that ended released and removed it


LOCK_AND_FORK = textwrap.dedent("""
    import os, sys, time
    from rpg_ref.trainer import run_folder
    run_folder.claim(sys.argv[1])
    if os.fork() == 0:
        time.sleep(60)  # a helper the run forked (no exec), outliving it
        os._exit(0)
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_forked_child_does_not_keep_a_killed_runs_lock(tmp_path):
    """The process holding the lock forks a child, then is SIGKILLed: the folder can be claimed
    at once although the child lives on."""
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", LOCK_AND_FORK, str(out)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(errors.FolderBusy, match=f"PID {p.pid} on"):
        run_folder.claim(out)
    children = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
    p.send_signal(signal.SIGKILL)
    p.wait()
    try:
        assert children and Path(f"/proc/{children[0]}").exists()  # the child is still there
        run_folder.claim(out).release()
    finally:
        for c in children:
            os.kill(int(c), signal.SIGKILL)


def test_a_run_refused_after_claiming_a_new_folder_leaves_nothing(tmp_path, capsys, monkeypatch):
    """The lock is taken before the run's inputs are read (creating OUT when it does not exist);
    a run refused then (here by a failing prepare) removes what it created."""
    out = tmp_path / "a" / "b" / "run"

    def refuse(cfg):
        assert (out / run_folder.LOCK).exists()  # held while the inputs are checked
        raise ValueError("bad data, for the test")

    monkeypatch.setattr(cli, "prepare", refuse)
    assert cli.main([*BANDIT, "--out", str(out)]) == 2
    assert one_line(capsys.readouterr().err) == "rpg-train: bad data, for the test"
    assert not (tmp_path / "a").exists()


# ------------------------------------------------------------------------------------------
# verified checkpoints
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """20 steps, a checkpoint every 5 (all kept)."""
    out = tmp_path_factory.mktemp("base") / "run"
    argv = [*BANDIT, "--steps", "20", "--save-every", "5", "--keep-checkpoints", "0"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    return out


@pytest.fixture
def run(base, tmp_path) -> Path:
    """A copy of base as a killed run leaves it: the step-20 checkpoint written, no summary."""
    out = tmp_path / "run"
    shutil.copytree(base, out)
    (out / "summary.json").unlink()
    return out


def ck(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}"


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def blocks_sha256(data: bytes, block: int) -> list[str]:
    return [hashlib.sha256(data[i:i + block]).hexdigest()
            for i in range(0, max(len(data), 1), block)]


def test_every_checkpoint_file_is_in_its_manifest(base):
    """manifest.json lists every other file of the folder, with its size and the sha256 of each
    of its blocks (computed here with hashlib)."""
    for step in (5, 10, 15, 20):
        folder = ck(base, step)
        manifest = json.loads((folder / checkpoint.MANIFEST).read_text())
        files = manifest["files"]
        assert set(files) == {p.name for p in folder.iterdir()} - {checkpoint.MANIFEST}
        for name, entry in files.items():
            data = (folder / name).read_bytes()
            assert entry["bytes"] == len(data)
            assert entry["sha256"] == blocks_sha256(data, manifest["block_bytes"])


def test_a_changed_byte_in_any_block_of_a_file_is_caught(tmp_path, monkeypatch):
    """Blocks of 1000 bytes: a file of several blocks is listed block by block, and a changed
    byte in its last block is caught as well as one in its first."""
    monkeypatch.setattr(checkpoint, "BLOCK", 1000)
    out = tmp_path / "o"
    cfg = cli.parse_config([*BANDIT, "--out", str(out)])
    checkpoint.save_checkpoint(out, 1, {"opt.pt": {"x": torch.arange(2000.0)}}, cfg)
    folder = ck(out, 1)
    data = (folder / "opt.pt").read_bytes()
    entry = json.loads((folder / "manifest.json").read_text())["files"]["opt.pt"]
    assert len(entry["sha256"]) == -(-len(data) // 1000) >= 8
    assert entry["sha256"] == blocks_sha256(data, 1000)
    for at in (10, len(data) - 10):
        (folder / "opt.pt").write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
        assert "opt.pt differs from its manifest" in checkpoint.problem(folder)
    (folder / "opt.pt").write_bytes(data)
    assert checkpoint.problem(folder) is None


def test_manifest_covers_files_added_to_the_state_dict(tmp_path):
    """A file the state dict carries under any name (as a feature that adds its own files does)
    is written, listed and verified like the others."""
    out = tmp_path / "o"
    cfg = cli.parse_config([*BANDIT, "--out", str(out)])
    state = {"model.safetensors": torch.nn.Linear(2, 2), "sampler_lag.pt": {"x": torch.ones(3)}}
    checkpoint.save_checkpoint(out, 1, state, cfg)
    assert "sampler_lag.pt" in json.loads((ck(out, 1) / "manifest.json").read_text())["files"]
    assert checkpoint.problem(ck(out, 1)) is None
    flip_bit(ck(out, 1) / "sampler_lag.pt")
    assert "sampler_lag.pt differs from its manifest" in checkpoint.problem(ck(out, 1))


CHECKPOINT_FILES = ["model.safetensors", "optimizer.pt", "rng.pt", "state.json", "manifest.json"]


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_a_flipped_bit_is_caught_and_the_previous_checkpoint_used(run, base, capsys, monkeypatch,
                                                                  name):
    """One bit flipped in any file of the latest checkpoint: resume says so in one line naming
    the file and continues from the newest intact checkpoint (step 15); steps 16-20 are computed
    again and equal the original run's, bitwise. The engine's part of the checkpoint is restored
    from that same checkpoint."""
    restored = []
    restore = sampler_lag.OnPolicy.restore
    monkeypatch.setattr(sampler_lag.OnPolicy, "restore",
                        lambda self, policy, ck: restored.append(ck) or restore(self, policy, ck))
    flip_bit(ck(run, 20) / name)
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 0
    err = one_line(capsys.readouterr().err)
    assert "checkpoint step_000020 is damaged" in err and "resuming from step_000015" in err
    assert (name if name != "manifest.json" else "manifest") in err
    assert steps(run) == list(range(1, 23))
    assert strip(rows(run)[:20]) == strip(rows(base))
    # where files a feature adds to a checkpoint are read on resume: the same step as the weights
    assert restored == [ck(run, 15)]


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng.pt"])
def test_a_truncated_file_with_no_older_checkpoint_is_one_line(run, capsys, name):
    """A truncated file and no other checkpoint: exit 2, one line naming the file and its size;
    nothing is written."""
    for step in (5, 10, 15):
        shutil.rmtree(ck(run, step))
    path = ck(run, 20) / name
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    before = (run / "metrics.jsonl").read_bytes()
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "no intact checkpoint" in err and f"{name} has {size // 2} bytes" in err, err
    assert (run / "metrics.jsonl").read_bytes() == before


def test_a_checkpoint_without_manifest_that_cannot_be_loaded_is_one_line(run, capsys):
    """A folder without manifest.json (written before checkpoints had one) is loaded as it is;
    a truncated file in it ends in one line naming the file, not a traceback."""
    for step in (5, 10, 15):
        shutil.rmtree(ck(run, step))
    (ck(run, 20) / "manifest.json").unlink()
    path = ck(run, 20) / "model.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 2
    assert "model.safetensors cannot be loaded" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("latest,said", [("", "LATEST is empty"),
                                         ("step_000030", "names 'step_000030'"),
                                         (None, "LATEST is missing")])
def test_a_bad_latest_falls_back_to_the_newest_intact_checkpoint(run, base, capsys, latest, said):
    """LATEST empty, naming a folder that does not exist, or missing: one line, and the newest
    intact checkpoint (step 20) is used."""
    path = run / "checkpoints" / "LATEST"
    path.unlink() if latest is None else path.write_text(latest)
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 0
    err = one_line(capsys.readouterr().err)
    assert said in err and "resuming from step_000020" in err
    assert strip(rows(run)[:20]) == strip(rows(base))


def test_a_corrupt_state_json_in_an_unverified_checkpoint_is_named(run, capsys):
    """A state.json that is no JSON, in a checkpoint without manifest: its name in one line."""
    for step in (5, 10, 15):
        shutil.rmtree(ck(run, step))
    (ck(run, 20) / "manifest.json").unlink()
    (ck(run, 20) / "state.json").write_text('{"step": 20\n "config"')
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "state.json is unreadable" in err


@pytest.mark.parametrize("field,value", [("lr", "fast"), ("steps", "many"), ("seed", None)])
def test_a_mistyped_config_json_is_one_line(run, capsys, field, value):
    """A mistyped value in OUT/config.json: exit 2, one line naming the file."""
    path = run / "config.json"
    cfg = json.loads(path.read_text())
    cfg[field] = value
    path.write_text(json.dumps(cfg))
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 2
    assert str(path) in one_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------
# metric rows: 1..checkpoint, each once
# ------------------------------------------------------------------------------------------


def test_deleted_metric_rows_are_refused(run, capsys):
    """Rows 8-12 deleted: resume refuses in one line naming them; nothing is written."""
    text = "".join(json.dumps(r) + "\n" for r in rows(run) if not 8 <= r["step"] <= 12)
    (run / "metrics.jsonl").write_text(text)
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 2
    assert "lacks the rows of steps 8-12" in one_line(capsys.readouterr().err)
    assert (run / "metrics.jsonl").read_text() == text


def test_a_deleted_metrics_file_is_refused(run, capsys):
    (run / "metrics.jsonl").unlink()
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 2
    assert "metrics.jsonl is missing" in one_line(capsys.readouterr().err)
    assert not (run / "metrics.jsonl").exists()


def test_repeated_rows_and_a_bad_row_are_refused(run, capsys):
    """Rows written twice (two writers mixed) and a row that is not JSON (file:line)."""
    good = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(good[:5] + good[3:]))
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 2
    assert "holds steps 4-5 more than once" in one_line(capsys.readouterr().err)
    (run / "metrics.jsonl").write_text("".join(good[:6] + ['{"step": 7, "reward": }\n'] + good[7:]))
    assert cli.main(["--resume", str(run), "--steps", "22"]) == 2
    assert f"{run / 'metrics.jsonl'}:7: not a metrics row" in one_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------
# a full disk
# ------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (needs root; CI's fault-injecting test below covers machines without)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()[:80]})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_on_a_small_filesystem(small_disk, capsys):
    """A checkpoint that does not fit: one line naming the folder and the bytes needed; the
    previous checkpoint intact, LATEST on it, no partial folder; once space is freed the resume
    continues with rows 1..N."""
    out = small_disk / "run"
    argv = [*BANDIT, "--steps", "5", "--save-every", "5", "--out", str(out)]
    assert cli.main(argv) == 0
    (out / "summary.json").unlink()
    ballast = small_disk / "ballast"
    free = shutil.disk_usage(small_disk).free
    ballast.write_bytes(b"\0" * (free - 24 * 1024))  # room for rows, not for a checkpoint
    capsys.readouterr()
    assert cli.main(["--resume", str(out), "--steps", "10", "--save-every", "5"]) == 1
    err = one_line(capsys.readouterr().err)
    assert f"no space left in {out / 'checkpoints'}" in err and "needs about" in err, err
    assert "step_000005 is intact" in err
    assert latest(out) == "step_000005" and checkpoint.problem(ck(out, 5)) is None
    assert not run_folder.leftovers(out) and not ck(out, 10).exists()
    ballast.unlink()
    assert cli.main(["--resume", str(out), "--steps", "10"]) == 0
    assert steps(out) == list(range(1, 11))


def test_disk_full_reported_by_torch_save_is_one_line(run, capsys, monkeypatch):
    """torch.save on a full disk raises "unexpected pos" (no errno): judged by the space left,
    it is the same one line, and no partial checkpoint folder stays."""
    real_save = torch.save

    def full_disk_save(obj, path, *a, **kw):
        real_save(obj, path, *a, **kw)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 46 vs 45")

    usage = shutil.disk_usage
    monkeypatch.setattr(torch, "save", full_disk_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(p)._replace(free=4096))
    assert cli.main(["--resume", str(run), "--steps", "25"]) == 1
    err = one_line(capsys.readouterr().err)
    assert "no space left" in err and "step 25" in err and "step_000020 is intact" in err
    assert latest(run) == "step_000020" and not run_folder.leftovers(run)


def test_other_write_errors_are_not_called_a_full_disk(run, monkeypatch):
    def broken_save(obj, path, *a, **kw):
        raise RuntimeError("some other failure")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(RuntimeError, match="some other failure"):
        cli.main(["--resume", str(run), "--steps", "25"])
    assert not run_folder.leftovers(run)


# ------------------------------------------------------------------------------------------
# values that stop being finite; a gradient that stays 0
# ------------------------------------------------------------------------------------------


def test_a_run_whose_weights_blow_up_stops_in_one_line(tmp_path, capsys):
    """--lr 1e38 without clipping: the weights leave the floats in the first update; the run ends
    (exit 1) with one line naming the step and the flags, and no checkpoint of them is written."""
    out = tmp_path / "o"
    assert cli.main([*BANDIT, "--lr", "1e38", "--grad-clip", "0", "--out", str(out)]) == 1
    err = one_line(capsys.readouterr().err)
    assert err.startswith("rpg-train: step 1: ") and "training diverged" in err
    assert "--lr (now 1e+38)" in err and "--grad-clip > 0" in err
    assert not (out / "checkpoints").exists()


class Cfg:
    """What Watch reads of a Config."""
    lr, grad_clip, ref, beta, prompts_per_step, group_size = 0.5, 1.0, "iterative", 1e-3, 4, 4
    mini_batch_size, updates_per_step = 8, None


def test_watch_stops_at_a_non_finite_row_and_reports_a_zero_gradient_once():
    w = metrics.Watch(Cfg())
    row = {"step": 1, "loss": 0.1, "grad_norm": 0.2, "entropy": 1.0, "reward": 0.5, "updates": 2}
    w.check(row)
    for s in range(2, 7):
        w.check({**row, "step": s, "loss": 0.0, "grad_norm": 0.0})
    line = w.verdict()
    assert line.startswith("rpg-train: warning: steps 2-4: every update had a zero gradient")
    assert "--grad-clip" not in line  # clipping is on: only the learning rate is named
    w.check({**row, "loss": float("nan"), "grad_norm": float("nan"), "updates": 0})  # no update
    with pytest.raises(errors.Diverged, match=r"step 9: loss is nan: .*lower --lr \(now 0.5\)"):
        w.check({**row, "step": 9, "loss": float("nan")})
    with pytest.raises(errors.Diverged, match=r"step 9: grad_norm is inf"):
        w.check({**row, "step": 9, "grad_norm": float("inf")})


def zero_gradient_rows(accuracy: float) -> list:
    first = {"step": 1, "loss": 0.1, "grad_norm": 0.2, "entropy": 1.0, "reward": 0.5,
             "accuracy": 0.5, "updates": 2}
    return [first] + [{**first, "step": s, "loss": 0.0, "grad_norm": 0.0, "entropy": 0.0,
                       "reward": 1.0, "accuracy": accuracy} for s in range(2, 7)]


def test_a_zero_gradient_with_every_response_correct_is_convergence_unless_pi_ref_pulls():
    """Every response correct and a zero gradient: with pi_ref = pi_old (or beta 0) the policy is
    at the optimum: no warning, summary.json's health says converged. With a fixed pi_ref and
    beta > 0 the KL-regularized optimum is elsewhere (a saturated softmax has a zero gradient
    there too): the warning. A zero gradient with wrong responses: the warning."""
    w = metrics.Watch(Cfg(), zero_gradient_rows(1.0))
    assert w.verdict() is None and w.health().startswith("converged at step 2: every response")
    beta0 = type("Beta0", (Cfg,), {"ref": "init", "beta": 0.0})
    assert metrics.Watch(beta0(), zero_gradient_rows(1.0)).verdict() is None
    pulled = type("Pulled", (Cfg,), {"ref": "init"})
    assert "steps 2-4: every update" in metrics.Watch(pulled(), zero_gradient_rows(1.0)).verdict()
    assert "not learning" in metrics.Watch(Cfg(), zero_gradient_rows(0.0)).verdict()


def simulated_rows(gen, n: int, p: list) -> list:
    """Rows of a run whose step t has accuracy Binomial(n, p[t]) / n (reward: the same)."""
    acc = np.random.default_rng(gen).binomial(n, p) / n
    return [{"step": t + 1, "loss": 0.1, "grad_norm": 0.1, "entropy": 1.0, "reward": a,
             "accuracy": a, "updates": 1} for t, a in enumerate(acc)]


def test_the_collapse_rule_warns_on_a_collapse_and_almost_never_on_noise():
    """The stated rule (rpg_ref.trainer.metrics.Watch): 20-step runs of n responses per step.
    Flat accuracy 0.25 (only noise): the binomial gives a false alarm in about 0.16 % of runs at
    n = 16 (a lucky step 1 of 9/16 or more; 4 of these 4000 seeded runs) and below 1e-8 per run at
    n = 128; the bounds (24 and 0 of 4000) fail with probability < 1e-6 and < 1e-4. Accuracy 0.4
    at step 1, then 0.05: found in every run at n = 128 (a miss needs step 1 below 0.21:
    probability < 1e-5 per run)."""
    for n, bound in ((16, 0.006), (128, 0.0)):
        cfg = type("C", (Cfg,), {"prompts_per_step": n // 4, "group_size": 4})()
        alarms = sum(metrics.Watch(cfg, simulated_rows(seed, n, [0.25] * 20)).verdict() is not None
                     for seed in range(4000))
        assert alarms <= bound * 4000, (n, alarms)
    cfg = type("C", (Cfg,), {"prompts_per_step": 32, "group_size": 4})()
    for seed in range(200):
        line = metrics.Watch(cfg, simulated_rows(seed, 128, [0.4] + [0.05] * 19)).verdict()
        assert line is not None and "the policy collapsed: accuracy" in line, seed
        assert "down from" in line and "at step 1" in line and "lower --lr (now 0.5)" in line


def held_out_rows(rewards: list, held_out: list) -> list:
    """Rows of a run with these training rewards and, every 5 steps from step 1, these held-out
    accuracies (training accuracy flat at 0.3: only the held-out measure moves)."""
    rows = [{"step": t + 1, "loss": 0.1, "grad_norm": 0.1, "entropy": 1.0, "reward": r,
             "accuracy": 0.3, "updates": 16} for t, r in enumerate(rewards)]
    for row, acc in zip(rows[::5], held_out):
        row["eval_sampled_accuracy"] = acc
    return rows


def test_a_rising_reward_with_a_falling_held_out_accuracy_is_exploitation_not_collapse():
    """The training reward rises (-0.285 -> -0.05) while the held-out accuracy falls to 0: the
    warning says the reward is being exploited, names the held-out measure, and advises a KL term
    to the start and fewer updates per batch, not a lower learning rate. The same held-out fall
    with a falling reward is a collapse, with the learning-rate advice."""
    rising = [-0.285 + 0.235 * t / 19 for t in range(20)]  # steps 11-20: -0.285 + 0.235 * 14.5 / 19
    cfg = type("Hacked", (Cfg,), {"ref": "init", "beta": 0.0, "updates_per_step": 16})()
    line = metrics.Watch(cfg, held_out_rows(rising, [0.6, 0.4, 0.1, 0.0])).verdict()
    assert line.startswith("rpg-train: warning: the reward is being exploited: the training "
                           "reward rose from -0.285 at step 1 to -0.106 over steps 11-20 while "
                           "held-out sampled_accuracy 0 at step 16, down from 0.6 at step 1"), line
    assert line.endswith("add a KL term to the start (--ref init and --beta > 0; now --ref init, "
                         "--beta 0) or fewer updates per batch (now 16: --updates-per-step)"), line
    assert "--lr" not in line
    larger = type("Beta", (Cfg,), {"ref": "init", "beta": 0.1, "updates_per_step": 1})()
    line = metrics.Watch(larger, held_out_rows(rising, [0.6, 0.4, 0.1, 0.0])).verdict()
    assert line.endswith("add a larger --beta (now 0.1)"), line
    # the carry task's trade: the accuracy 0.47 -> 0 and the responses 22 -> 3 tokens (a token
    # cost of 0.02): the reward falls (0.03 -> -0.06), its part beyond the accuracy rises
    shrinking = [{"step": t + 1, "loss": 0.1, "grad_norm": 0.1, "entropy": 1.0, "updates": 16,
                  "accuracy": 0.47 if t < 5 else 0.0, "reward": (0.47 - 0.44) if t < 5 else -0.06}
                 for t in range(20)]
    line = metrics.Watch(cfg, shrinking).verdict()
    assert line.startswith("rpg-train: warning: the reward is being exploited: its part beyond the "
                           "accuracy (reward - accuracy: a token cost, a length penalty) rose from "
                           "-0.44 at step 1 to -0.06 over steps 11-20 while accuracy 0 over steps "
                           "11-20"), line
    assert "--lr" not in line
    falling = rising[::-1]
    line = metrics.Watch(cfg, held_out_rows(falling, [0.6, 0.4, 0.1, 0.0])).verdict()
    assert line.startswith("rpg-train: warning: the policy collapsed: held-out sampled_accuracy 0 "
                           "at step 16"), line
    assert line.endswith("lower --lr (now 0.5)"), line


def test_a_bandit_at_its_optimum_converges_without_a_warning(tmp_path, capsys):
    """--lr 1000: one update puts every response on the best arm; with pi_ref = pi_old that is the
    optimum, so the zero gradient that follows is convergence: no warning, exit 0, and
    summary.json's health says converged."""
    out = tmp_path / "o"
    assert cli.main([*BANDIT, "--lr", "1000", "--steps", "6", "--out", str(out)]) == 0
    assert not [x for x in capsys.readouterr().err.splitlines() if "rpg-train" in x]
    health = json.loads((out / "summary.json").read_text())["health"]
    assert health.startswith("converged at step 2: every response correct"), health


def test_a_bandit_stuck_away_from_its_optimum_warns_of_zero_gradients(tmp_path, capsys):
    """--lr 1000 with --ref init: one update saturates the softmax on the best arm, where the
    gradient is 0 although the KL-regularized optimum (beta 0.5 to the initial policy) is
    elsewhere: one warning line says the policy is not learning."""
    out = tmp_path / "o"
    argv = [*BANDIT, "--lr", "1000", "--ref", "init", "--steps", "6", "--out", str(out)]
    assert cli.main(argv) == 0
    err = [x for x in capsys.readouterr().err.splitlines() if "rpg-train" in x]
    assert len(err) == 1 and "steps 2-4: every update had a zero gradient" in err[0], err


def in_a_terminal(argv: list, interrupt_after_rows: int | None = None, out: Path | None = None,
                  interrupt_when_shown: bytes | None = None):
    """rpg-train run in a pseudo-terminal of 120 columns (so tqdm draws its bar), sent SIGINT once
    ``out`` holds that many metrics rows, or once the terminal has shown ``interrupt_when_shown``
    (None: never); returns (exit code, the lines a terminal shows: each line's text after its last
    carriage return, blank ones dropped)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "rpg_ref.cli", *argv], stdin=slave, stdout=slave,
                         stderr=slave, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         preexec_fn=sigint_as_in_a_terminal)
    STARTED.append(p)
    os.close(slave)
    shown, sent, deadline = b"", False, time.time() + 300
    while time.time() < deadline:
        if (interrupt_after_rows and not sent and (out / "metrics.jsonl").exists()
                and (out / "metrics.jsonl").read_text().count("\n") >= interrupt_after_rows):
            p.send_signal(signal.SIGINT)
            sent = True
        if interrupt_when_shown and not sent and interrupt_when_shown in shown:
            p.send_signal(signal.SIGINT)
            sent = True
        if select.select([master], [], [], 0.1)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other end closed: the run has ended
                break
            if not data:
                break
            shown += data
    os.close(master)
    text = shown.decode(errors="replace")
    lines = [line.rstrip("\r").split("\r")[-1].rstrip() for line in text.split("\n")]
    return p.wait(timeout=60), [line for line in lines if line]


def test_in_a_terminal_a_warning_has_its_own_line_and_ctrl_c_shows_one(tmp_path):
    """In a terminal, with tqdm's progress bar: the warning of a bandit stuck away from its optimum
    stands on a line of its own (the bar, then the warning, then the final line), and Ctrl-C
    clears the bar and shows the one line of the interruption, nothing else."""
    out = tmp_path / "w"
    code, lines = in_a_terminal(["--preset", "bandit", "--ref", "init", "--lr", "1000",
                                 "--steps", "6", "--out", str(out)])
    assert code == 0 and len(lines) == 3, lines
    assert lines[0].startswith("rpg-train: 100%|") and lines[2].startswith("done: ")
    assert lines[1].startswith("rpg-train: warning: steps 2-4: every update had a zero gradient")
    out = tmp_path / "c"
    code, lines = in_a_terminal(["--preset", "bandit", "--steps", "100000", "--out", str(out)],
                                interrupt_after_rows=2, out=out)
    assert code == 130 and len(lines) == 1, lines
    assert lines[0].startswith("rpg-train: interrupted (SIGINT) after step "), lines


def test_ctrl_c_during_a_warm_start_shows_its_one_line_alone(tmp_path):
    """In a terminal, Ctrl-C while the seq task's warm start draws its progress bar: the bar is
    cleared, and the interruption's one line stands alone (exit 130)."""
    code, lines = in_a_terminal(["--task", "seq", "--seq-warm-steps", "100000", "--cache-dir",
                                 str(tmp_path / "cache"), "--out", str(tmp_path / "o")],
                                interrupt_when_shown=b"supervised warm start")  # its bar
    assert code == 130 and len(lines) == 1, lines
    assert lines[0].startswith("rpg-train: interrupted (SIGINT)"), lines


def test_resume_of_a_run_that_never_started_says_so(tmp_path, capsys):
    """A run killed while it set up leaves its folder (with the lock file) but no config.json:
    --resume says the run never started and that its own command starts it again (exit 2);
    a folder that does not exist is still "no run there"."""
    out = tmp_path / "o"
    out.mkdir()
    (out / run_folder.LOCK).write_text("123 host\n")
    assert cli.main(["--resume", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert err == (f"rpg-train: --resume {out}: the run there never started ({out}/config.json "
                   f"was never written: it was stopped while setting up); the command that "
                   f"started it starts it again")
    assert cli.main(["--resume", str(tmp_path / "none")]) == 2
    assert "no run there" in one_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------
# rpg-eval on a folder that is no model; rpg-plot on a bad row
# ------------------------------------------------------------------------------------------


def _folder(root: Path, files: dict) -> Path:
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


HF = {"config.json": '{"model_type": "qwen3"}'}
RUN = {"config.json": '{"algo": "grpo"}'}


@pytest.mark.parametrize("files,said", [
    ({**RUN, "checkpoints/LATEST": "step_000001", "hf/config.json": "{}"},
     "is an rpg-train run folder; its exported model is {dir}/hf: pass that"),
    ({**RUN, "metrics.jsonl": ""},
     "is an rpg-train run folder, not a model; `python -m rpg_ref.export {dir}`"),
    ({"notes.txt": "hello"}, "is not a Hugging Face checkpoint folder (no config.json)"),
    ({"config.json": '{"hidden_size": 8}'}, "(its config.json has no model_type)"),
    (HF, "has no weights"),
    ({**HF, "model.safetensors": "x"}, "has no tokenizer"),
])
def test_rpg_eval_on_a_folder_that_is_no_model_is_one_line(tmp_path, capsys, files, said):
    from rpg_ref.math import evaluation

    folder = _folder(tmp_path / "m", files)
    assert evaluation.main(["--model", str(folder), "--data", "aime24"]) == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"rpg-eval: error: --model '{folder}' ")
    assert said.format(dir=folder) in err


def test_rpg_plot_names_the_file_and_line_of_a_bad_row(base, tmp_path, capsys):
    from rpg_ref import plot

    out = tmp_path / "run"
    shutil.copytree(base, out)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    bad = lines[:2] + ['{"step": 3, "reward": }\n'] + lines[3:]
    (out / "metrics.jsonl").write_text("".join(bad))
    assert plot.main([str(out), "--out", str(tmp_path / "p.png")]) == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"rpg-plot: {out / 'metrics.jsonl'}:3: not a metrics row")
    assert not (tmp_path / "p.png").exists()
