"""small_scale/study/carry_properties.py: each property's rule on rows built by hand (one where it
holds, one where it does not), and the task's lengths against the closed form 5n + 2 +
len(a + b)."""

import pytest

pytest.importorskip("scipy")

import small_scale.study.carry_properties as P
import small_scale.study.files as S

OUT = {"len_mean": 28.0, "kl_ref_last": 0.01, "len_last": 28.0, "reward_last": 0.3,
       "clip_low_mean": 0.02, "clip_high_mean": 0.03, "clip_dual_mean": 0.01}


def row(cell, seed, heldout, cpu=30.0, t="2026-01-01T00:00:00", **outcomes):
    return {"cell": cell, "seed": seed, "cpu_s": cpu, "resumed_from_step": 0, "finished_utc": t,
            "outcomes": {**OUT, "heldout": heldout, **outcomes}}


def rows_where(gain: float, warm: float = 0.5, clip_u16: float = 0.06, cpu: float = 30.0):
    out = []
    for s in range(10):
        # one run per seed trains the warm start (+170 s): the reference cell's on even seeds; on
        # odd ones urkl-u1's, which finishes after the reference run that waited for it
        trains = s % 2 == 0
        out.append(row("warm-start", s, warm, cpu=200.0 if trains else 5.0,
                       t=f"2026-01-01T00:{s:02d}:00"))
        out.append(row("urkl-u1", s, warm + gain + (0.05 if s % 2 else 0.0),
                       cpu=cpu if trains else cpu + 170.0, t=f"2026-01-01T01:{s:02d}:00"))
        out.append(row("urkl-u16", s, 0.4, cpu=cpu, t=f"2026-01-01T02:{s:02d}:00",
                       clip_low_mean=clip_u16, clip_high_mean=0.0, clip_dual_mean=0.0))
    return out


LENGTHS = {"worked_mean": 29.0, "worked_sd": 8.0, "worked_min": 8, "worked_max": 39,
           "direct_mean": 6.6}
GOOD_CONTRAST = {"n": 10, "mean": 0.2, "lo": 0.1, "hi": 0.3, "p_holm": 0.001, "mde": 0.1}


def by_name(props):
    return {p["name"]: p for p in props}


def test_each_rule_holds_and_fails_where_it_should():
    spec = S.load_study("C")
    good = by_name(P.properties(rows_where(0.2), spec, 1.0, GOOD_CONTRAST, LENGTHS))
    assert good["on-policy RL improves"]["holds"] is True
    assert good["the warm start succeeds"]["holds"] is True
    assert good["the clip binds off-policy"]["holds"] is True            # 0.06 and 0.06
    assert good["the KL term has a job"]["holds"] is True
    assert good["responses are long and vary"]["holds"] is True
    # beta KL = 1.0 * 0.01 * 28 = 0.28; share 0.28 / (0.3 + 0.28)
    assert "0.483" in good["beta KL is part of the objective"]["measured"]
    assert good["a run costs <= 60 s CPU"]["holds"] is True
    cost = good["a run costs <= 60 s CPU"]["measured"]
    assert "medians 5-30 s" in cost and "run that trains its warm start 200 s" in cost

    bad = by_name(P.properties(rows_where(0.08, warm=0.15, clip_u16=0.04, cpu=70.0), spec, 0.01,
                               {**GOOD_CONTRAST, "mean": 0.05}, {**LENGTHS, "worked_mean": 20}))
    # gains 0.08 and 0.13: 5 of 10 seeds reach +0.10
    assert bad["on-policy RL improves"]["holds"] is False
    assert "5 / 10 seeds" in bad["on-policy RL improves"]["measured"]
    assert bad["the warm start succeeds"]["holds"] is False              # 0.15 < 0.2
    assert bad["the clip binds off-policy"]["holds"] is False            # 0.04 + 0 + 0
    assert bad["the KL term has a job"]["holds"] is False                # 0.05 < MDE 0.1
    assert bad["beta KL is part of the objective"]["holds"] is False     # 0.0028 / 0.3028
    assert bad["responses are long and vary"]["holds"] is False
    assert bad["a run costs <= 60 s CPU"]["holds"] is False
    # a seed the exclusion rule drops still counts against the warm start: 10 kept + 1 failed
    failed = [row("warm-start", 99, 0.1, cpu=200.0)]
    kept = rows_where(0.2)
    some = by_name(P.properties(kept, spec, 1.0, GOOD_CONTRAST, LENGTHS, all_rows=kept + failed))
    assert "10 / 11 seeds" in some["the warm start succeeds"]["measured"]
    assert some["the warm start succeeds"]["holds"] is False             # 10 / 11 < 0.95
    # nothing measured yet: every property n/a
    empty = P.properties([], spec, None, None, LENGTHS)
    assert all(p["holds"] is None for p in empty)


def test_the_task_lengths_are_the_closed_form():
    """Over the same 20,000 problems: a worked response is 5 max(len a, len b) + 2 + len(a + b)
    tokens, a direct one 2 + len(a + b)."""
    import types

    import torch

    from rpg_ref.tasks.carry import CarryTask
    got = P.task_lengths(20000)
    cfg = types.SimpleNamespace(task_options={}, max_new_tokens=40, seed=0, init_seed=None,
                                cache_dir="unused", progress=False, temperature=1.0)
    ps = CarryTask(cfg, torch.device("cpu")).sample_prompts(20000,
                                                           torch.Generator().manual_seed(1))
    worked = [5 * max(len(str(a)), len(str(b))) + 2 + len(str(a + b))
              for a, b in (p.answer for p in ps)]
    assert got["worked_mean"] == pytest.approx(sum(worked) / len(worked), abs=1e-12)
    assert (got["worked_min"], got["worked_max"]) == (min(worked), max(worked)) == (8, 39)
    direct = [2 + len(str(a + b)) for a, b in (p.answer for p in ps)]
    assert got["direct_mean"] == pytest.approx(sum(direct) / len(direct), abs=1e-12)


def test_the_docs_table_is_what_the_committed_rows_give(tmp_path, monkeypatch, capsys):
    """docs/carry_task.md's table is the one the committed rows give (--check exits 0); a table
    that differs is reported (exit 1) and --write rewrites it."""
    assert P.main(["--check"]) == 0
    doc = tmp_path / "carry_task.md"
    doc.write_text(P.DOC.read_text().replace(P.BEGIN + "\n", P.BEGIN + "\n| stale |\n"))
    monkeypatch.setattr(P, "DOC", doc)
    assert P.main(["--check"]) == 1
    assert "differs from the rows" in capsys.readouterr().err
    assert P.main(["--write"]) == 0 and P.main(["--check"]) == 0
    assert "| stale |" not in doc.read_text()


def test_the_table_has_four_columns_on_every_row():
    """No cell's text holds a '|' (it would split the markdown table's row)."""
    spec = S.load_study("C")
    for props in (P.properties(rows_where(0.2), spec, 1.0, GOOD_CONTRAST, LENGTHS),
                  P.properties([], spec, None, None, LENGTHS)):
        for line in P.table(props).splitlines():
            assert line.count("|") == 5, line
