"""small_scale/bench/floors.py: its floors compute what they stand in for (the static-KV loop
samples what the hf engine samples; the GEMM floor counts and replays the matrix products that
ran), it makes the run a study recorded, refuses bad flags in one line, and runs end to end on a
tiny run. What it measures is not asserted: timings are its output, not a test's."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_hf_engine import EOS, PAD, tiny_qwen3  # tests/ is on sys.path under pytest

from rpg_ref.engines.hf import decode
from small_scale.bench import floors as B


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_static_kv_loop_samples_what_the_hf_engine_samples(temperature, top_p):
    """float64: the hand-written loop and the hf engine's decode, from the same seed on left-padded
    prompts of different lengths, sample the same tokens (stopping together at EOS) with log-probs
    equal to 1e-10: the floor computes the policy's distribution, not something cheaper."""
    model = tiny_qwen3(sharpen=3.0)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]] * 3
    out = []
    for fn in (B.static_kv_decode, lambda *a: decode(model, *a)):
        torch.manual_seed(0)
        out.append(fn(model, prompts, PAD, EOS, temperature, top_p, 12))
    (toks, lps), (want_toks, want_lps) = out
    assert torch.equal(toks, want_toks)
    assert (lps - want_lps).abs().max() < 1e-10
    assert (toks == EOS).any()


def test_gemm_floor_records_and_replays_the_products_that_ran():
    """A linear layer with bias, forward and backward on x [3, 4, 5] -> 7 features: addmm forward,
    two mm backward (input and weight gradients), 3 x 2 x 12 x 5 x 7 = 2520 FLOPs; a bmm of an
    expanded (stride 0) operand, 2 x 4 x 3 x 5 x 2 = 240 more. The replay runs them on tensors of
    the same shapes and strides."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 7)
    x = torch.randn(3, 4, 5, requires_grad=True)
    a, b = torch.randn(3, 5), torch.randn(4, 5, 2)
    with B.RecordGemms() as rec:
        lin(x).sum().backward()
        torch.bmm(a.expand(4, 3, 5), b)
    names = [f.__name__.split(".")[0] for f, _, _ in rec.calls]
    assert sorted(names) == ["addmm", "bmm", "mm", "mm"]
    run, flops = B.gemm_replay(rec.calls)
    assert flops == 2520 + 240
    run()
    expanded = next(spec for f, spec, _ in rec.calls if f.__name__.startswith("bmm"))[0]
    assert expanded[1][0] == 0  # the replayed operand keeps its stride 0


def test_a_study_run_is_its_recorded_flags_without_the_runners(tmp_path):
    """The run of (study, cell, seed) is the argv its results row records after `python -m
    rpg_ref.cli`, less --out, --cache-dir and --no-progress with their values; a cell or seed that
    did not run, or a study with no results, is one clear error."""
    rows = [
        {"cell": "other", "seed": 0, "argv": ["python", "-m", "rpg_ref.cli", "--steps", "9"]},
        {"cell": "c", "seed": 1, "argv": ["python", "-m", "rpg_ref.cli", "--preset", "seq",
                                          "--steps", "40", "--out", "runs/x", "--cache-dir",
                                          "runs/cache", "--threads", "1", "--no-progress"]},
    ]
    (tmp_path / "S.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert B.study_argv("S", "c", 1, tmp_path) == ["--preset", "seq", "--steps", "40",
                                                    "--threads", "1"]
    with pytest.raises(ValueError, match="holds no run of cell 'c', seed 0"):
        B.study_argv("S", "c", 0, tmp_path)
    with pytest.raises(ValueError, match="no results file"):
        B.study_argv("T", "c", 1, tmp_path)


@pytest.mark.parametrize("flags,run_flags,message", [
    (["--repeats", "0"], [], "--repeats must be >= 1, got 0"),
    (["--gen-tokens", "64", "0"], [], "--gen-tokens must be >= 1, got 0"),
    ([], ["--steps", "2"], "flags after -- go with --task or --preset"),
    (["--cell", "no-such-cell"], [], "holds no run of cell 'no-such-cell', seed 0"),
    (["--task", "seq"], ["--steps", "0"], "--steps must be an integer >= 1"),
])
def test_bad_flags_are_one_line_before_any_work(flags, run_flags, message, tmp_path, capsys):
    """Exit code 2, one line on stderr naming the mistake, nothing printed or written."""
    cache = tmp_path / "cache"
    argv = [*flags, "--cache-dir", str(cache)] + (["--", *run_flags] if run_flags else [])
    assert B.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("bench_floors: ") and err.count("\n") == 1
    assert message in err
    assert not cache.exists()


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end_on_a_tiny_run(tmp_path, capsys):
    """A 2-step seq run (no warm start, 4 prompts x 2, 16 held-out problems): the phase table's
    rows, their shares adding up to the run (100% to rounding), and a finite positive ratio for
    every piece of work beside every floor, generation at 5 and 8 new tokens included."""
    argv = ["--task", "seq", "--gen-tokens", "8", "--repeats", "1", "--cache-dir",
            str(tmp_path / "cache"), "--", "--steps", "2", "--seq-warm-steps", "0",
            "--seq-eval-size", "16", "--prompts-per-step", "4", "--group-size", "2",
            "--mini-batch-size", "8", "--eval-every", "1"]
    assert B.main(argv) == 0
    out = capsys.readouterr().out
    shares = [float(x) for x in re.findall(r"^\| [^|*]+ \| [\d.]+ \| ([\d.]+)% \|$", out, re.M)]
    assert len(shares) == 9 and abs(sum(shares) - 100) <= 0.05 * len(shares)
    works = {"python start + imports": "`python -c pass`",
             "generation: 4 prompts x 2, 5 new tokens (EOS off)": "static-KV loop",
             "generation: 4 prompts x 2, 8 new tokens (EOS off)": "static-KV loop",
             "evaluation: 16 prompts x 1, greedy, up to 5 new tokens (16 sequences), scored":
             "static-KV loop, the same sequences",
             "log-probs: the batch of 8": "bare HF forward",
             "update: 1 mini-batch of 8": "bare HF loop",
             "update: 1 mini-batch of 8 ": "GEMM floor"}
    rows = [line.split(" | ") for line in out.splitlines() if re.search(r"x \(.*\) \|$", line)]
    assert len(rows) == len(works)
    for (work, floor), row in zip(works.items(), rows):
        assert row[0].startswith("| " + work.strip()) and row[2].startswith(floor), row
        ratio = float(row[4].split("x")[0])
        assert math.isfinite(ratio) and ratio > 0


@pytest.mark.slow
def test_the_evaluation_floor_decodes_what_the_task_evaluates(tmp_path, capsys):
    """The carry task evaluates Mean@k: k sampled responses per held-out problem. Its row names
    that work (8 problems x 4 at the run's temperature: 32 sequences), and the floor's decode is
    the same generation, recorded from the task's evaluate (prompts, k, temperature, top-p,
    token limit)."""
    argv = ["--task", "carry", "--repeats", "1", "--cache-dir", str(tmp_path / "cache"), "--",
            "--steps", "1", "--carry-warm-steps", "0", "--carry-eval-size", "8",
            "--carry-eval-samples", "4", "--prompts-per-step", "2", "--group-size", "2",
            "--mini-batch-size", "4", "--eval-every", "1", "--carry-max-digits", "1",
            "--max-new-tokens", "12"]
    assert B.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| evaluation: ")]
    assert len(rows) == 1, rows
    assert rows[0].startswith("| evaluation: 8 prompts x 4, sampled at temperature 1, up to 12 "
                              "new tokens (32 sequences), scored (the task's evaluate) | "), rows
    assert "| static-KV loop, the same sequences |" in rows[0]

    class Engine:
        def generate(self, prompts, n, temperature, top_p, max_new_tokens):
            return len(prompts) * n
    engine = Engine()
    calls = B.generate_calls(engine, lambda: (engine.generate([[1], [2]], 4, 0.7, 0.9, 6),
                                              engine.generate([[3]], 1, 0.0, 1.0, 5)))
    assert calls == [([[1], [2]], 4, 0.7, 0.9, 6), ([[3]], 1, 0.0, 1.0, 5)]
    assert "generate" not in vars(engine)   # the class's own method again
    assert B.evaluation_work(calls) == ("2 prompts x 4, sampled at temperature 0.7, up to 6 new "
                                        "tokens; 1 prompts x 1, greedy, up to 5 new tokens "
                                        "(9 sequences)")
