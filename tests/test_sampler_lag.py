"""Tests of --sampler-lag (rpg_ref/trainer/sampler_lag.py) and --init-seed.

--sampler-lag K: step t samples with the weights after max(0, t-1-K) updates (checked exactly,
on the weights each generate call used), evaluation sees the current weights, a stopped and
resumed run equals the uninterrupted one bit for bit, lag 0 is the run without the flag, and the
bandit still reaches its KL-regularized optimum. --init-seed: the initialization follows it, the
sampling follows --seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file
from tiny_runs import small_seq_argv

from rpg_ref import cli
from rpg_ref.engines.hf import HFEngine
from rpg_ref.engines.sample import SampleEngine
from rpg_ref.registry import ENGINES
from rpg_ref.trainer import train
from rpg_ref.trainer.sampler_lag import LAG_FILE, LaggedEngine, OnPolicy

VOLATILE = ("time_", "_per_s", "peak_mem_mb")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One warm-start cache for the module (the seq warm start runs once per init seed)."""
    return str(tmp_path_factory.mktemp("rpg_cache"))


def run(argv: list) -> dict:
    return train.train(cli.parse_config([*argv, "--no-progress"]))


def rows(out) -> list:
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def strip(rs: list) -> list:
    return [{k: v for k, v in r.items() if not any(s in k for s in VOLATILE)} for r in rs]


def weights(out, step: int, name: str = "model.safetensors") -> dict:
    return load_file(Path(out) / "checkpoints" / f"step_{step:06d}" / name)


TIED = ("lm_head.weight", "model.embed_tokens.weight")  # the seq model's one tied tensor


def same(a: dict, b: dict) -> bool:
    """Equal weights; a tied tensor may be stored under either of its names."""
    a, b = ({TIED[1] if k == TIED[0] else k: v for k, v in d.items()} for d in (a, b))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------
# what each generate call samples with
# ------------------------------------------------------------------------------------------

CALLS: list = []  # (temperature, {name: weights of the module the engine sampled with})


class RecordingSample(SampleEngine):
    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        CALLS.append((temperature, {k: v.detach().clone() for k, v in
                                    self.policy.named_parameters()}))
        return super().generate(prompts, n, temperature, top_p, max_new_tokens)


class RecordingHF(HFEngine):
    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        CALLS.append((temperature, {k: v.detach().clone() for k, v in
                                    self.policy.named_parameters()}))
        return super().generate(prompts, n, temperature, top_p, max_new_tokens)


@pytest.mark.parametrize("task,engine,lag", [("bandit", "sample", 2), ("seq", "hf", 3),
                                             ("seq", "hf", 0)])
def test_step_t_samples_with_the_weights_of_update_t_minus_1_minus_k(
        tmp_path, cache_dir, monkeypatch, task, engine, lag):
    """Every rollout of step t (temperature > 0) samples with exactly (torch.equal) the weights
    after max(0, t-1-K) updates: the checkpoint of step t-1-K, or pi_ref = the initial policy;
    every evaluation (seq: greedy, temperature 0) at step t with the weights of step t. The
    weights change at every step, so no other step's weights would pass."""
    recording = {"bandit": RecordingSample, "seq": RecordingHF}[task]
    monkeypatch.setitem(ENGINES, f"rec-{engine}", recording)
    CALLS.clear()
    out = tmp_path / "o"
    steps = 7
    common = ["--steps", str(steps), "--save-every", "1", "--keep-checkpoints", "0", "--ref",
              "init", "--sampler-lag", str(lag), "--out", str(out), "--engine", f"rec-{engine}"]
    if task == "bandit":
        argv = ["--preset", "bandit", "--lr-decay", "constant", *common]
    else:
        argv = small_seq_argv(eval_every=2, cache_dir=cache_dir) + common
    cfg = cli.parse_config([*argv, "--no-progress"])
    prepared = train.prepare(cfg)
    assert type(prepared.engine) is (LaggedEngine if lag else OnPolicy)  # lag 0: the engine itself
    train.train(cfg, prepared)

    w = {0: weights(out, 1, "ref.safetensors")}
    w.update({s: weights(out, s) for s in range(1, steps + 1)})
    for s in range(1, steps + 1):
        assert not same(w[s], w[s - 1]), f"step {s} did not change the weights"
    rollouts = [c for t, c in CALLS if t > 0]
    evals = [c for t, c in CALLS if t == 0]
    assert len(rollouts) == steps
    for t, used in enumerate(rollouts, start=1):
        want = max(0, t - 1 - lag)
        assert same(used, w[want]), f"step {t} sampled with other weights than step {want}'s"
    if task == "seq":
        assert len(evals) == 5  # the initial policy before step 1, steps 2, 4, 6 and the last
        for s, used in zip((0, 2, 4, 6, 7), evals):
            assert same(used, w[s]), f"evaluation at step {s} did not use step {s}'s weights"
    if lag:
        lagged = torch.load(out / "checkpoints" / f"step_{steps:06d}" / LAG_FILE,
                            weights_only=True)["history"]
        assert len(lagged) == lag + 1
        for i, h in enumerate(lagged):
            assert same(h, w[steps - lag + i])


# ------------------------------------------------------------------------------------------
# lag 0 is the run without the flag; resume is bitwise with a lag
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["bandit", "seq"])
def test_lag_0_and_init_seed_equal_to_seed_are_the_run_without_the_flags(tmp_path, cache_dir,
                                                                         task):
    """--sampler-lag 0, and --init-seed equal to --seed, give bitwise the weights and exactly the
    metrics of the run without either flag; a lag of 1 gives another run."""
    argv = (["--preset", "bandit", "--steps", "20"] if task == "bandit"
            else small_seq_argv(steps=6, eval_every=3, cache_dir=cache_dir))
    outs = {}
    for name, extra in (("plain", []), ("lag0", ["--sampler-lag", "0", "--init-seed", "3"]),
                        ("lag1", ["--sampler-lag", "1"])):
        outs[name] = tmp_path / name
        run([*argv, "--seed", "3", "--out", str(outs[name]), *extra])
    last = 20 if task == "bandit" else 6
    plain, lag0, lag1 = (weights(outs[n], last) for n in ("plain", "lag0", "lag1"))
    assert same(plain, lag0)
    assert strip(rows(outs["plain"])) == strip(rows(outs["lag0"]))
    assert not same(plain, lag1)


@pytest.mark.parametrize("task", ["bandit", "seq"])
def test_pi_old_sampler_without_a_lag_is_the_run_without_the_flag(tmp_path, cache_dir, task):
    """--pi-old sampler with no stale sampler (the sampler is the policy): bitwise the weights
    and exactly the metrics of the run without the flag."""
    argv = (["--preset", "bandit", "--steps", "20"] if task == "bandit"
            else small_seq_argv(steps=6, eval_every=3, cache_dir=cache_dir))
    for name, extra in (("plain", []), ("coupled", ["--pi-old", "sampler"])):
        run([*argv, "--seed", "3", "--out", str(tmp_path / name), *extra])
    last = 20 if task == "bandit" else 6
    assert same(weights(tmp_path / "plain", last), weights(tmp_path / "coupled", last))
    assert strip(rows(tmp_path / "plain")) == strip(rows(tmp_path / "coupled"))


def test_pi_old_sampler_takes_the_ratio_against_the_stale_sampler(tmp_path, cache_dir):
    """A seq run with --sampler-lag 2 and one update per rollout batch. --pi-old current (the
    default): pi_old is the policy at the start of the step, so the one update sees w = 1 on every
    token (ratio_mean 1, the clip never binds) and the engine's log-probs differ from pi_old's by
    the 2 updates' change. --pi-old sampler: pi_old is the sampler, so the recomputed log-probs are
    the engine's own (up to float rounding), and the ratio moves away from 1 from step 2 on, the
    first step whose sampler (the initial weights until step 3) is older than the policy."""
    argv = small_seq_argv(steps=8, eval_every=8, cache_dir=cache_dir, lr=3e-3, sampler_lag=2,
                          mini_batch_size=16)
    out = {}
    for mode in ("current", "sampler"):
        run([*argv, "--seed", "1", "--out", str(tmp_path / mode), "--pi-old", mode])
        out[mode] = rows(tmp_path / mode)
    for r in out["current"]:
        assert abs(r["ratio_mean"] - 1) < 1e-5
        assert r["clip_frac_low"] == r["clip_frac_high"] == 0
    late = [r for r in out["current"] if r["step"] >= 2]
    assert min(r["logprob_diff_max"] for r in late) > 1e-3     # the sampler is behind
    for r in out["sampler"]:
        assert r["logprob_diff_max"] < 1e-4                    # pi_old is the sampler
    assert abs(out["sampler"][0]["ratio_mean"] - 1) < 1e-5     # step 1: sampler = policy
    assert max(abs(r["ratio_mean"] - 1) for r in out["sampler"][1:]) > 1e-3


def test_resume_with_a_lag_is_bitwise(tmp_path, cache_dir):
    """A seq run with --sampler-lag 3 and TIS stopped after 4 steps and resumed to 9 ends with
    bitwise the weights, AdamW state and lag history, and exactly the metrics (all but timings),
    of the uninterrupted 9-step run (evaluations every 2 steps swap weights in and out)."""
    argv = small_seq_argv(eval_every=2, cache_dir=cache_dir, sampler_lag=3,
                          rollout_correction="tis", save_every=1)
    a, b = tmp_path / "a", tmp_path / "b"
    run([*argv, "--steps", "9", "--out", str(a)])
    run([*argv, "--steps", "4", "--out", str(b)])
    assert len(rows(b)) == 4
    run(["--resume", str(b), "--steps", "9"])
    assert strip(rows(a)) == strip(rows(b))
    assert same(weights(a, 9), weights(b, 9))
    ha, hb = (torch.load(o / "checkpoints" / "step_000009" / LAG_FILE, weights_only=True)
              for o in (a, b))
    assert len(ha["history"]) == 4 and all(same(x, y) for x, y in zip(ha["history"],
                                                                      hb["history"]))
    oa, ob = (torch.load(o / "checkpoints" / "step_000009" / "optimizer.pt", weights_only=True)
              for o in (a, b))
    for i in oa["state"]:
        for k in oa["state"][i]:
            assert torch.equal(oa["state"][i][k], ob["state"][i][k]), (i, k)


def test_a_lagged_checkpoint_without_its_history_is_refused(tmp_path):
    """--resume of a lagged run whose checkpoint lost sampler_lag.pt stops with one line naming
    the file (the checkpoint's manifest lists it), instead of sampling with other weights than the
    uninterrupted run."""
    out = tmp_path / "o"
    run(["--preset", "bandit", "--steps", "2", "--sampler-lag", "1", "--out", str(out)])
    (out / "checkpoints" / "step_000002" / LAG_FILE).unlink()
    (out / "summary.json").unlink()
    with pytest.raises(ValueError, match=f"step_000002 is damaged: {LAG_FILE} is missing"):
        run(["--resume", str(out), "--steps", "3"])


# ------------------------------------------------------------------------------------------
# the bandit's optimum with a stale sampler
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("correction", [["--rollout-correction", "tis",
                                         "--rollout-correction-level", "sequence"],
                                        ["--rollout-correction", "mis",
                                         "--rollout-correction-cap", "inf"]])
def test_bandit_reaches_the_regularized_optimum_with_a_lag_and_rollout_correction(tmp_path,
                                                                                  correction):
    """--preset bandit --ref init --sampler-lag 2 with rollout correction reaches the optimum of
    E[R] - beta KL(pi || pi_ref) within total variation 0.02 (the lag-0 test's tolerance,
    tests/test_train.py), and its importance weights were active (the sampler was stale)."""
    s = run(["--preset", "bandit", "--ref", "init", "--sampler-lag", "2", *correction,
             "--out", str(tmp_path / "o")])
    assert s["tv_distance"] < 0.02, s["tv_distance"]
    early = rows(tmp_path / "o")[:20]
    assert max(r["rc_log_ratio_max"] for r in early) > 0.1  # pi_old / pi_sampler far from 1


# ------------------------------------------------------------------------------------------
# --init-seed
# ------------------------------------------------------------------------------------------


def _initial(argv: list, out) -> dict:
    """The policy's weights as prepare() builds them (before any update)."""
    run_ = train.prepare(cli.parse_config([*argv, "--out", str(out), "--no-progress"]))
    return {k: v.detach().clone() for k, v in run_.policy.named_parameters()}


@pytest.mark.parametrize("task", ["bandit", "seq"])
def test_init_seed_sets_the_initial_weights_and_seed_the_sampling(tmp_path, task):
    """Runs with one --init-seed and different --seed start from the same weights (seq: warm
    starts computed independently, each in its own cache) and sample differently (their weights
    after one update differ); different --init-seed give different initial weights."""
    def argv(seed: int, init: int, name: str) -> list:
        if task == "bandit":
            base = ["--preset", "bandit", "--steps", "1", "--lr-decay", "constant"]
        else:
            base = small_seq_argv(steps=1, cache_dir=tmp_path / f"cache-{name}", seq_warm_steps=20)
        return [*base, "--seed", str(seed), "--init-seed", str(init)]

    w_a = _initial(argv(1, 7, "a"), tmp_path / "a")
    w_b = _initial(argv(2, 7, "b"), tmp_path / "b")
    w_c = _initial(argv(1, 8, "c"), tmp_path / "c")
    assert same(w_a, w_b) and not same(w_a, w_c)
    outs = []
    for seed in (1, 2):
        outs.append(tmp_path / f"r{seed}")
        run([*argv(seed, 7, "a"), "--ref", "init", "--out", str(outs[-1])])
    ra, rb = (weights(o, 1, "ref.safetensors") for o in outs)
    assert same(ra, rb) and same(ra, w_a)  # the same initial policy ...
    assert not same(weights(outs[0], 1), weights(outs[1], 1))  # ... sampled differently


def test_init_seed_shares_the_seq_warm_start_cache(tmp_path):
    """The seq warm start is cached under the init seed: two seeds with one init seed write one
    cache file; another init seed writes a second."""
    cache = tmp_path / "cache"
    base = small_seq_argv(steps=1, cache_dir=cache, seq_warm_steps=5)
    for i, (seed, init) in enumerate(((0, 3), (1, 3), (1, 4))):
        _initial([*base, "--seed", str(seed), "--init-seed", str(init)], tmp_path / str(i))
        assert len(list(cache.glob("seq-warm-*"))) == (1 if i < 2 else 2)


# ------------------------------------------------------------------------------------------
# refusals
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,msg", [
    (["--sampler-lag", "-1"], "--sampler-lag must be an integer >= 0"),
    (["--sampler-lag", "2", "--rollout-correction", "tis", "--no-hf-sampler-logprobs"],
     "needs the sampler's own log-probs"),
    (["--sampler-lag", "2", "--rollout-correction", "tis", "--top-p", "0.9"], "--top-p 1"),
])
def test_bad_lag_configurations_are_refused(tmp_path, argv, msg, capsys):
    """Each bad combination stops rpg-train with exit code 2 and one line, before anything is
    written."""
    out = tmp_path / "o"
    assert cli.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_a_lag_and_an_engine_without_log_probs_runs_uncorrected(tmp_path, cache_dir):
    """--sampler-lag with an engine that reports no log-probs and no rollout correction is the
    uncorrected stale sampler: it runs, and logs no sampler statistics."""
    out = tmp_path / "o"
    run(small_seq_argv(steps=2, cache_dir=cache_dir, sampler_lag=1, hf_sampler_logprobs=False,
                       out=out))
    assert all("logprob_diff_max" not in r and "rc_ess" not in r for r in rows(out))
    assert np.isfinite(rows(out)[-1]["loss"])


def test_a_lag_with_the_hf_engines_bf16_copy_keeps_its_sync_protocol(tmp_path, cache_dir):
    """The hf engine sampling from a bf16 copy (freed by sleep(), rebuilt and checked by
    sync_weights, refusing to sample from a freed copy) under a lag with an evaluation at every
    step (two more syncs each): the run completes with the correction's statistics logged."""
    out = tmp_path / "o"
    run(small_seq_argv(steps=3, eval_every=1, cache_dir=cache_dir, sampler_lag=1,
                       hf_gen_dtype="bfloat16", rollout_correction="tis", out=out))
    assert [r["step"] for r in rows(out)] == [1, 2, 3]
    assert all("rc_ess" in r and "eval_greedy_accuracy" in r for r in rows(out))
