"""torchrun data parallelism (rpg_ref/trainer/distributed/) on 2 CPU ranks with gloo.

Each torchrun launch costs seconds, so they are shared: one launch of tests/distributed_worker.py
(update equivalence, bytes per rank), one 2-rank bandit run (the regularized optimum, and the
uninterrupted reference for resume), one run whose rank 1 is SIGKILLed and its resume, one run
stopped by SIGTERM during a checkpoint write and its resume. These tests are marked
``distributed`` and left out of a plain ``pytest`` run (pyproject's addopts); run them with
``pytest -m distributed`` (CI does, in its own step).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tiny_runs import tiny_math_argv

from rpg_ref import cli
from rpg_ref.trainer import presets, train
from rpg_ref.trainer.config_checks import check_job

pytestmark = pytest.mark.distributed
REPO = Path(__file__).resolve().parents[1]
TIMING_KEYS = ("time_", "_per_s", "peak_mem_mb")
BANDIT = ["--task", "bandit", "--ref", "init", "--save-every", "50", "--no-progress"]


def torchrun(args: list, env: dict | None = None, **kw) -> subprocess.Popen:
    env = env or {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc_per_node", "2", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def finish(p: subprocess.Popen, timeout: float = 600) -> str:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"torchrun failed ({p.returncode}):\n{out[-3000:]}\n{err[-5000:]}"
    return out


def rows(out: Path) -> list:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------
# one update: 2 ranks == 1 process on the union batch; bytes per rank
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("worker") / "results.json"
    finish(torchrun([str(REPO / "tests" / "distributed_worker.py"), str(path)]))
    return json.loads(path.read_text())


@pytest.mark.parametrize("case", ["token-mean", "seq-mean-token-mean",
                                  "token-mean micro-batches by tokens, ref",
                                  "seq-mean micro-batches of 2", "two mini-batches, two passes",
                                  "rollout correction tis, token",
                                  "rollout correction mis, sequence"])
def test_one_update_on_2_ranks_equals_one_process_on_union_batch(worker, case):
    """The update (rpg_ref.trainer.train.update: micro-batch weights, global-norm clipping, fused
    AdamW) of a float64 tiny Qwen3 on 2 FSDP2 ranks, each training its half of every mini-batch,
    gives the parameters of one process on the whole batch to 1e-12 (the update itself moves them
    by about 1e-2), for token-mean and seq-mean losses. With two mini-batches per pass and two
    passes, the ranks seed their own generators differently: only rank 0's mini-batch order, sent
    to both, makes them train the one-process mini-batches. Loss and gradient norm agree to 1e-12
    as well."""
    r = worker["cases"][case]
    assert r["grad_clipped"]  # the global norm was used, not only computed
    assert r["param_max_abs_change"] > 1e-3
    assert r["param_max_abs_diff"] <= 1e-12, r
    assert r["loss_grad_norm_max_abs_diff"] <= 1e-12, r


def test_token_mean_statistics_equal_one_process(worker):
    """With a token-mean loss every logged statistic of the update (loss, grad norm, kl_old,
    ratio_mean, clip fractions) is the one-process value on the union batch (1e-12)."""
    for case in ("token-mean", "token-mean micro-batches by tokens, ref",
                 "two mini-batches, two passes"):
        assert worker["cases"][case]["stats_max_abs_diff"] <= 1e-12, worker["cases"][case]


def test_rollout_correction_statistics_equal_one_process(worker):
    """--rollout-correction on 2 ranks: every rank weights the whole batch and trains its share (the
    update above equals the one-process update on the union batch), and the logged rc_* statistics
    are those of the union batch (1e-12): some weight was capped (tis, token level) or masked (mis,
    sequence level)."""
    for case in ("rollout correction tis, token", "rollout correction mis, sequence"):
        rc = worker["cases"][case]["rc_stats"]
        assert set(rc) == {"rc_weight_mean", "rc_capped_frac", "rc_log_ratio_max", "rc_ess"}, rc
        assert all(abs(one - two) <= 1e-12 for one, two in rc.values()), (case, rc)
        assert 0 < rc["rc_capped_frac"][0] < 1 and rc["rc_ess"][0] < 1, (case, rc)


def test_every_rank_gets_the_whole_batch_and_its_advantages(worker):
    """The rollout on 2 ranks (rpg_ref.trainer.distributed: Workers.generate, Workers.reward,
    map_rows; 3 groups of 4, the middle one spanning the ranks): each rank's engine samples and
    its task scores exactly its 6 responses, each rank computes the log-probs of its 6 rows, and
    both ranks then hold the same 12 responses (groups in prompt order), sampler log-probs,
    rewards and log-probs, the rewards and log-probs equal to one process's on the whole batch.
    Every advantage estimator of rpg_ref.core.advantages (group mean, group mean/std, batch mean,
    leave-one-out, REINFORCE++ and its baseline variant, which whiten over every token) computed
    from them gives the one-process advantages (float64, 1e-12)."""
    w = worker["whole_batch"]
    assert w["every_rank_holds_the_same"] and w["groups_in_order"] and w["responses"] == 12, w
    assert w["sampled_scored_per_rank"] == [[6, 6], [6, 6]], w
    assert w["rewards_equal_one_process"] and w["logprobs_equal_one_process"], w
    assert len(w["advantages"]) == 6
    for name, diff in w["advantages"].items():
        assert diff <= 1e-12, (name, diff)


def test_parameter_and_optimizer_bytes_per_rank_are_half(worker):
    """FSDP2 gives each of 2 ranks exactly half of the parameters' bytes and half of AdamW's
    exp_avg and exp_avg_sq (the model's dimensions are even: no padding); the per-parameter step
    counters (scalars) are the only replicated optimizer state."""
    assert worker["world_size"] == 2
    full = worker["model_bytes"]
    for r in worker["per_rank"]:
        assert r["param_bytes"] * 2 == full
        assert r["opt_bytes"] * 2 == 2 * full
    assert worker["step_counters_bytes"] < 1e-3 * full


# ------------------------------------------------------------------------------------------
# the bandit on 2 ranks: the regularized optimum; a killed rank; bitwise resume
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bandit_2_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bandit2") / "run"
    finish(torchrun(["-m", "rpg_ref.cli", *BANDIT, "--out", str(out)]))
    return out


def test_bandit_on_2_ranks_reaches_the_regularized_optimum_of_one_process(bandit_2_ranks, tmp_path):
    """`torchrun --nproc_per_node 2 -m rpg_ref.cli --task bandit --ref init` reaches the optimum
    of E[R] - beta KL(pi || pi_ref) that one process reaches: the same optimum (same pi_ref and
    beta, equal to 1e-15), both final policies within total variation 0.02 of it (the one-process
    test's tolerance), and within 0.02 of each other. summary.json records world_size 2."""
    two = json.loads((bandit_2_ranks / "summary.json").read_text())
    one = train.train(cli.parse_config([*BANDIT, "--out", str(tmp_path / "one")]))
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert np.abs(np.array(two["optimum"]) - np.array(one["optimum"])).max() < 1e-15
    assert two["tv_distance"] < 0.02 and one["tv_distance"] < 0.02, (
        two["tv_distance"],
        one["tv_distance"],
    )
    assert 0.5 * np.abs(np.array(two["policy"]) - np.array(one["policy"])).sum() < 0.02
    assert len(rows(bandit_2_ranks)) == presets.PRESETS["bandit"]["steps"]


def _rank_pid(torchrun_pid: int, rank: int, timeout: float = 60) -> int:
    """The pid of a torchrun worker with RANK=rank (a child of the launcher)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        children = Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children").read_text().split()
        for c in children:
            try:
                env = Path(f"/proc/{c}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in env:
                return int(c)
        time.sleep(0.2)
    raise AssertionError("no worker found")


@pytest.fixture(scope="module")
def killed_rank(tmp_path_factory) -> dict:
    """The bandit run of bandit_2_ranks, rank 1 SIGKILLed once the step-100 checkpoint exists."""
    out = tmp_path_factory.mktemp("killed") / "run"
    p = torchrun(["-m", "rpg_ref.cli", *BANDIT, "--out", str(out)])
    pid = _rank_pid(p.pid, 1)
    latest = out / "checkpoints" / "LATEST"
    t0 = time.time()
    while not (latest.exists() and latest.read_text().strip() >= "step_000100"):
        assert p.poll() is None and time.time() - t0 < 600, "the run ended before step 100"
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("torchrun still running 60 s after a rank was killed") from None
    return {"out": out, "seconds": time.time() - t_kill, "returncode": p.returncode, "stderr": err,
            "steps_before": len(rows(out)), "pid": pid}


def test_killed_rank_stops_the_run_within_seconds(killed_rank):
    """SIGKILL of rank 1 mid-run ends the whole torchrun job within 15 s (no hang; about 4 s on the
    2-core machine), with a non-zero exit status, one line from rank 0 saying why it stopped and
    naming rank 1, and torchrun's report naming the rank and the signal. Rank 0 learns it either
    from its next collective (gloo: the connection closed) or from torchrun's SIGTERM, whichever
    comes first: a race, and both give the same line."""
    err = killed_rank["stderr"]
    assert killed_rank["returncode"] != 0
    assert killed_rank["seconds"] < 15, killed_rank["seconds"]
    lines = [ln for ln in err.splitlines() if ln.startswith("rpg-train:")]
    assert len(lines) == 1, err[-5000:]
    assert lines[0].startswith("rpg-train: rank 0 stopped: another rank died or stopped responding")
    assert f"rank 1 (PID {killed_rank['pid']} on " in lines[0] and "has exited" in lines[0]
    assert "SIGKILL" in err and "rank      : 1" in err
    assert killed_rank["steps_before"] < presets.PRESETS["bandit"]["steps"]


def test_2_rank_run_resumes_bitwise_after_sigkill(killed_rank, bandit_2_ranks):
    """The killed 2-rank run, resumed on 2 ranks, ends with bitwise the weights, pi_ref, AdamW
    state and metrics (all but timings and memory) of the uninterrupted 2-rank run."""
    out = killed_rank["out"]
    finish(torchrun(["-m", "rpg_ref.cli", "--resume", str(out), "--no-progress"]))
    ck, ref_ck = (o / "checkpoints" / (o / "checkpoints" / "LATEST").read_text().strip()
                  for o in (out, bandit_2_ranks))
    for name in ("model.safetensors", "ref.safetensors"):
        assert (ck / name).read_bytes() == (ref_ck / name).read_bytes(), name
    a, b = (torch.load(c / "optimizer.pt", weights_only=True) for c in (ck, ref_ck))
    for k in b["state"]:
        for key, v in b["state"][k].items():
            assert torch.equal(a["state"][k][key], v), (k, key)
    strip = lambda rs: [
        {k: v for k, v in r.items() if not any(t in k for t in TIMING_KEYS)} for r in rs
    ]
    assert strip(rows(out)) == strip(rows(bandit_2_ranks))


# rank 0 asks torchrun to stop (SIGTERM to the launcher, which sends SIGTERM to every rank) from
# inside the write of step 3's weights, and is still writing them a second later
SIGTERM_IN_CHECKPOINT = r"""
import os, signal, sys, time
import safetensors.torch
from rpg_ref.cli import main
save_model = safetensors.torch.save_model
def interrupted_save_model(model, path, *a, **kw):
    if os.environ["RANK"] == "0" and "step_000003" in path:
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(1.0)  # the rank's own SIGTERM arrives meanwhile
    return save_model(model, path, *a, **kw)
safetensors.torch.save_model = interrupted_save_model
from rpg_ref.trainer.distributed.setup import exit_process
exit_process(main(sys.argv[1:]))
"""


def test_sigterm_during_a_checkpoint_write_on_2_ranks(tmp_path):
    """torchrun stopped (SIGTERM to every rank) while rank 0 writes step 3's checkpoint: the job
    ends within 15 s of step 3's row (about 2 s on the 2-core machine; a rank left waiting for
    another would hold it until torchrun's SIGKILL, 30 s after its SIGTERM: nothing collective
    happens while a rank defers), rank 0 completes the checkpoint first (rows 1-3, LATEST at step
    3, its one line names both), and a 2-rank --resume from it finishes the run."""
    script, out = tmp_path / "run_with_sigterm.py", tmp_path / "run"
    script.write_text(SIGTERM_IN_CHECKPOINT)
    argv = [*BANDIT, "--steps", "5", "--save-every", "3", "--out", str(out)]
    p = torchrun([str(script), *argv])
    while not ((out / "metrics.jsonl").exists()
               and (out / "metrics.jsonl").read_text().count("\n") >= 3):
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    t_row = time.time()
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("torchrun still running 120 s after step 3's row") from None
    assert time.time() - t_row < 15, time.time() - t_row
    lines = [ln for ln in err.splitlines() if ln.startswith("rpg-train:")]
    assert p.returncode != 0 and len(lines) == 1, err[-3000:]
    assert "interrupted (SIGTERM) after step 3 of 5; saved: checkpoint of step 3 " in lines[0]
    assert [r["step"] for r in rows(out)] == [1, 2, 3]
    assert (out / "checkpoints" / "LATEST").read_text() == "step_000003"
    finish(torchrun(["-m", "rpg_ref.cli", "--resume", str(out), "--no-progress"]))
    assert [r["step"] for r in rows(out)] == [1, 2, 3, 4, 5]


# rank 0 SIGKILLs rank 1 from inside the write of step 3's weights (a section that defers signals)
# and stays there 3 s: torchrun's agent sees rank 1 die and SIGTERMs rank 0 before any collective
# of rank 0 can fail, the side of the race that once lost the killed-rank test its line
KILL_PEER_IN_CHECKPOINT = r"""
import os, signal, sys, time
from pathlib import Path
import safetensors.torch
from rpg_ref.cli import main
pids = Path(os.environ["RPG_TEST_PIDS"])
(pids / os.environ["RANK"]).write_text(str(os.getpid()))
save_model = safetensors.torch.save_model
def kill_peer_save_model(model, path, *a, **kw):
    mine = "step_000003_%d/model.safetensors" % os.getpid()
    if os.environ["RANK"] == "0" and path.endswith(mine):
        os.kill(int((pids / "1").read_text()), signal.SIGKILL)
        time.sleep(3.0)
    return save_model(model, path, *a, **kw)
safetensors.torch.save_model = kill_peer_save_model
from rpg_ref.trainer.distributed.setup import exit_process
exit_process(main(sys.argv[1:]))
"""


def test_rank_stopped_by_torchrun_names_the_rank_that_died(tmp_path):
    """Rank 1 dies while rank 0 is in a section that defers signals, so rank 0 learns of it from
    torchrun's SIGTERM, not from a failed collective: its one line still says another rank died
    and names rank 1 and its PID (not "interrupted")."""
    script, out, pids = tmp_path / "kill_peer.py", tmp_path / "run", tmp_path / "pids"
    script.write_text(KILL_PEER_IN_CHECKPOINT)
    pids.mkdir()
    p = torchrun([str(script), *BANDIT, "--steps", "6", "--save-every", "3", "--out", str(out)],
                 env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                      "RPG_TEST_PIDS": str(pids)})
    try:
        _, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("torchrun still running 300 s after its start") from None
    lines = [ln for ln in err.splitlines() if ln.startswith("rpg-train:")]
    assert p.returncode != 0 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("rpg-train: rank 0 stopped: another rank died or stopped responding")
    assert "torchrun stopped this rank with SIGTERM" in lines[0], lines[0]
    assert f"rank 1 (PID {(pids / '1').read_text()} on " in lines[0] and "has exited" in lines[0]
    assert (out / "checkpoints" / "LATEST").read_text() == "step_000003"


def refused_on_every_rank(p: subprocess.Popen, err: str) -> str:
    """The project's line of a torchrun job that rpg-train refused: printed once (by rank 0),
    every rank exited with code 2 by itself (torchrun's agent had to kill none: no SIGKILL 30 s
    after a SIGTERM, no "Unable to shutdown"), and the last line of torchrun's report, the last a
    user reads, is that same line as every rank's cause."""
    lines = [ln for ln in err.splitlines() if ln.startswith("rpg-train:")]
    assert p.returncode != 0 and len(lines) == 1, err[-3000:]
    report = err[err.index("Failures:"):]
    assert report.count("exitcode  : 2 ") == 2, report
    assert report.count(f"traceback : {lines[0]}") == 2, report
    assert "Unable to shutdown" not in err and "SIGKILL" not in err, err[-3000:]
    text = [ln.strip() for ln in err.splitlines() if ln.strip().strip("=")]
    assert text[-1] == f"traceback : {lines[0]}", err[-3000:]
    return lines[0]


def test_a_torchrun_job_with_a_bad_flag_is_refused_on_every_rank(tmp_path):
    """A bad value is refused by each rank in one line: every rank exits with code 2, the project's
    line is printed once and ends torchrun's report, and nothing is written."""
    out = tmp_path / "run"
    p = torchrun(["-m", "rpg_ref.cli", *BANDIT, "--lr", "-1", "--out", str(out)])
    _, err = p.communicate(timeout=300)
    line = refused_on_every_rank(p, err)
    assert line == "rpg-train: bad configuration: --lr must be finite and > 0, got -1.0"
    assert not out.exists()


def test_a_torchrun_job_into_a_folder_in_use_is_refused_by_rank_0(tmp_path):
    """Rank 0 takes the run folder's lock: a 2-rank job with the same flags into the folder of a
    run that is still going (and has no checkpoint yet, so nothing else refuses it) ends with rank
    0's one line naming that run's PID, on every rank at once (each exits with code 2), and the
    run goes on unharmed."""
    out = tmp_path / "run"
    argv = [*BANDIT, "--steps", "100000", "--save-every", "100000", "--out", str(out)]
    live = subprocess.Popen([sys.executable, "-m", "rpg_ref.cli", *argv], stderr=subprocess.PIPE,
                            text=True)
    try:
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert live.poll() is None, live.stderr.read()
            time.sleep(0.1)
        p = torchrun(["-m", "rpg_ref.cli", *argv])
        _, err = p.communicate(timeout=300)
        line = refused_on_every_rank(p, err)
        assert f"in use by another rpg-train (PID {live.pid} on " in line
        assert live.poll() is None
        live.send_signal(signal.SIGTERM)  # a clean stop: its rows end with a whole step
        assert live.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        live.kill()
        live.wait()
    assert [r["step"] for r in rows(out)] == list(range(1, len(rows(out)) + 1))


def test_resume_on_another_world_size_is_refused(bandit_2_ranks, capsys):
    """A 2-rank run resumed by one process is refused with one line naming both world sizes and
    the command to use (exit code 2), before anything is written."""
    before = (bandit_2_ranks / "metrics.jsonl").read_bytes()
    assert cli.main(["--resume", str(bandit_2_ranks), "--steps", "400"]) == 2
    err = capsys.readouterr().err
    assert "written by 2 rank(s), this run has 1" in err and "--nproc_per_node 2" in err
    assert len(err.strip().splitlines()) == 1
    assert (bandit_2_ranks / "metrics.jsonl").read_bytes() == before


def test_configurations_that_cannot_be_split_are_refused():
    """A batch or mini-batch not divisible by the number of ranks, or a per-rank mini-batch not
    divisible into micro-batches, is refused with the fix named."""
    cfg = cli.parse_config(["--task", "bandit"])  # 1 prompt x 512, mini-batch 128
    check_job(cfg, n_ranks=2)  # fine: groups may span ranks
    with pytest.raises(ValueError, match="divisible by 3"):
        check_job(cfg, n_ranks=3)
    cfg.micro_batch_size = 48
    with pytest.raises(ValueError, match="each rank's mini-batch"):
        check_job(cfg, n_ranks=2)


def test_hung_rank_stops_the_run_after_dist_timeout(tmp_path):
    """A rank that stops responding (SIGSTOP) makes the other rank's next collective time out
    after --dist-timeout seconds (10 here): rank 0 prints its one-line reason (gloo's timeout)
    between 5 and 30 s after the stop (rank 0 may already have been waiting for rank 1 when the
    stop came: the bound below 10 s allows for that), and the job ends with a non-zero status
    once the stopped rank can take torchrun's SIGTERM (it is continued after rank 0's line)."""
    import threading

    out = tmp_path / "run"
    p = torchrun(["-m", "rpg_ref.cli", *BANDIT, "--dist-timeout", "10", "--out", str(out)])
    pid = _rank_pid(p.pid, 1)
    lines = []
    reader = threading.Thread(target=lambda: [lines.append((time.time(), ln)) for ln in p.stderr],
                              daemon=True)
    reader.start()
    while not (out / "metrics.jsonl").exists():
        if p.poll() is not None:
            reader.join(timeout=10)
            raise AssertionError(f"the run ended ({p.returncode}) before its first step:\n"
                                 + "".join(ln for _, ln in lines)[-5000:])
        time.sleep(0.1)
    os.kill(pid, signal.SIGSTOP)
    t_stop = time.time()
    try:
        while not any("rank 0 stopped" in ln for _, ln in lines):
            assert time.time() - t_stop < 120, "no rank reported the hang within 120 s"
            time.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)
    t_line, line = next((t, ln) for t, ln in lines if "rank 0 stopped" in ln)
    assert 5 <= t_line - t_stop < 30, t_line - t_stop
    assert "Timed out" in line
    # the stopped rank is named: its heartbeat went quiet (torchrun's report names rank 0)
    assert f"rank 1 (PID {pid} on " in line and "gave no sign of life for" in line, line
    assert p.wait(timeout=120) != 0


def test_a_rank_late_to_set_up_is_not_a_hang(tmp_path):
    """Set-up waits longer than --dist-timeout: rank 1 stopped (SIGSTOP) for 15 s as it starts,
    with --dist-timeout 5, joins late and the run finishes (exit 0, every step logged); with the
    group's timeout at --dist-timeout from the start, rank 0 would time out waiting for it."""
    out = tmp_path / "run"
    p = torchrun(["-m", "rpg_ref.cli", *BANDIT, "--steps", "20", "--dist-timeout", "5",
                  "--out", str(out)])
    pid = _rank_pid(p.pid, 1)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(15)
    os.kill(pid, signal.SIGCONT)
    finish(p, timeout=300)
    assert [r["step"] for r in rows(out)] == list(range(1, 21))


def test_math_task_on_2_ranks_trains_and_exports(tmp_path):
    """The math task (the paper's recipe's code path: HFPolicy under bf16 autocast with gradient
    checkpointing, the hf engine's bf16 copy, the real Qwen3 tokenizer, AMC23 problems) runs 2
    steps on 2 ranks with a 2-layer Qwen3; rank 0 writes the run, and its Hugging Face export
    holds the checkpoint's full policy (every tensor equal)."""
    from safetensors.torch import load_file

    from rpg_ref.math.data import data_dir
    from rpg_ref.math.tiny_model import tiny_qwen3_config

    if not (data_dir() / "tokenizer" / "qwen3").exists():
        pytest.skip("shared data absent: set RPG_DATA_DIR")
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(tiny_qwen3_config()))
    out = tmp_path / "run"
    argv = tiny_math_argv(model, out, micro_batch_size=1, math_dtype="bf16-autocast",
                          math_gradient_checkpointing=True, threads=None)
    finish(torchrun(["-m", "rpg_ref.cli", *argv]))
    s = json.loads((out / "summary.json").read_text())
    assert s["world_size"] == 2 and len(rows(out)) == 2 and "eval_aime24_mean@2" in s["eval"]
    exported = load_file(str(out / "hf" / "model.safetensors"))
    trained = load_file(str(out / "checkpoints" / "step_000002" / "model.safetensors"))
    trained = {k.removeprefix("module."): v for k, v in trained.items()}
    trained = {
        ("model.embed_tokens.weight" if k == "lm_head.weight" else k): v for k, v in trained.items()
    }
    assert exported.keys() == trained.keys()
    for k, v in trained.items():
        assert torch.equal(exported[k], v), k


# ------------------------------------------------------------------------------------------
# --sampler-lag on 2 ranks: every rank samples with the same K-update-old weights
# ------------------------------------------------------------------------------------------

# the bandit's sample engine, recording the logits each of its generate calls sampled with
RECORD_SAMPLER = r"""
import os, sys, torch
from rpg_ref.cli import main
from rpg_ref.engines.sample import SampleEngine
from rpg_ref.registry import ENGINES
from rpg_ref.trainer.distributed.setup import exit_process
calls = []
class Recording(SampleEngine):
    def generate(self, *args):
        calls.append(self.policy.logits.detach().clone())
        return super().generate(*args)
ENGINES["recording"] = Recording
code = main(sys.argv[2:])
torch.save(calls, f"{sys.argv[1]}.rank{os.environ['RANK']}")
exit_process(code)
"""


def test_lagged_sampler_on_2_ranks_samples_the_same_old_weights_and_resumes_bitwise(tmp_path):
    """A 2-rank bandit run with --sampler-lag 2: at every step both ranks sample with exactly the
    weights of 2 updates before (the checkpoints of step t-3, pi_ref for the first steps); the run
    stopped after 4 steps and resumed on 2 ranks to 8 ends with bitwise the weights, lag history
    and metrics of the uninterrupted one, its ranks sampling with the same weights after the
    resume."""
    script = tmp_path / "record.py"
    script.write_text(RECORD_SAMPLER)
    argv = [*BANDIT, "--engine", "recording", "--sampler-lag", "2", "--lr-decay", "constant",
            "--save-every", "1", "--keep-checkpoints", "0"]
    a, b = tmp_path / "a", tmp_path / "b"
    finish(torchrun([str(script), str(tmp_path / "a"), *argv, "--steps", "8", "--out", str(a)]))
    calls = [torch.load(f"{a}.rank{r}", weights_only=True) for r in (0, 1)]
    assert len(calls[0]) == len(calls[1]) == 8
    from safetensors.torch import load_file

    w = [load_file(a / "checkpoints" / "step_000001" / "ref.safetensors")["logits"]]
    for s in range(1, 9):
        w.append(load_file(a / "checkpoints" / f"step_{s:06d}" / "model.safetensors")["logits"])
        assert not torch.equal(w[s], w[s - 1])
    for t in range(1, 9):
        for r in (0, 1):
            assert torch.equal(calls[r][t - 1], w[max(0, t - 3)]), (t, r)

    finish(torchrun([str(script), str(tmp_path / "b1"), *argv, "--steps", "4", "--out", str(b)]))
    finish(torchrun([str(script), str(tmp_path / "b2"), "--resume", str(b), "--steps", "8",
                     "--no-progress"]))
    resumed = [torch.load(f"{tmp_path / 'b2'}.rank{r}", weights_only=True) for r in (0, 1)]
    for r in (0, 1):
        assert len(resumed[r]) == 4
        assert all(torch.equal(x, y) for x, y in zip(resumed[r], calls[r][4:])), r
    for name in ("model.safetensors", "sampler_lag.pt"):
        ca, cb = (o / "checkpoints" / "step_000008" / name for o in (a, b))
        if name.endswith(".pt"):
            ha, hb = (torch.load(c, weights_only=True)["history"] for c in (ca, cb))
            assert all(torch.equal(x["logits"], y["logits"]) for x, y in zip(ha, hb))
        else:
            assert ca.read_bytes() == cb.read_bytes()
    # b's step 4 ended its first run, so it carries an evaluation that a's step 4 does not
    strip = lambda rs: [{k: v for k, v in r.items()
                         if not any(t in k for t in (*TIMING_KEYS, "eval_"))} for r in rs]
    assert strip(rows(a)) == strip(rows(b))
