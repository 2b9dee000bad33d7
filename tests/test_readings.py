"""small_scale/study/readings.py: study C's readings recomputed here from the raw rows (not
through the module), the committed block equal to the generator, and every number of
RESULTS.md's hand-written study summaries printed in one of its generated blocks."""

import json
import math
import re

import numpy as np
import pytest

pytest.importorskip("scipy", reason="the readings need scipy (pip install -e '.[study]')")
from scipy import stats

import small_scale.study.files as S
import small_scale.study.readings as R


def raw_rows(study: str) -> list[dict]:
    return [json.loads(line) for line in S.results_path(study).read_text().splitlines()]


def test_c_drop_and_vs_warm_recomputed_from_the_raw_rows():
    """The iterative-vs-frozen drop at 3 x beta and URKL + clip at 16 updates against its warm
    start, from the JSON lines with numpy and scipy directly (seed 17 excluded by C's rule)."""
    rows = [r for r in raw_rows("C") if r["seed"] != 17]
    cell = {(r["cell"], r["seed"]): r["outcomes"] for r in rows}

    def diffs(a, b, f):
        seeds = sorted({s for c, s in cell if c == a} & {s for c, s in cell if c == b})
        return np.array([f(cell[a, s]) - f(cell[b, s]) for s in seeds])

    d = diffs("urkl-iter-b3.0x-u4", "urkl-frozen-b3.0x-u4",
              lambda o: o["heldout_first"] - o["heldout_min"])
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    got = R.read("C")["stability"][0]["drop"]
    assert got["n"] == len(d) == 21
    assert abs(got["mean"] - d.mean()) < 1e-12 and abs(got["hi"] - (d.mean() + half)) < 1e-12
    v = diffs("urkl-u16", "warm-start", lambda o: o["heldout"])
    mine = R.read("C")["vs_warm"]["RPG-REINFORCE-URKL + RPG-Style Clip"]["16"]
    assert abs(mine["mean"] - v.mean()) < 1e-12 and mine["below"] == int((v < 0).sum())


def test_kl_shares_worked_by_hand():
    """beta 0.1, KL 0.5 per token, 20 tokens, reward -0.1: sequence 0.1*0.5*20 = 1 -> 1/1.1;
    token 0.05 -> 0.05/0.15."""
    seq, tok = R.kl_shares({"kl_ref_last": 0.5, "len_last": 20, "reward_last": -0.1}, 0.1)
    assert abs(seq - 1 / 1.1) < 1e-12 and abs(tok - 0.05 / 0.15) < 1e-12


def test_results_md_readings_blocks_equal_the_generator():
    assert R.write(check=True) == 0


def test_a_stale_readings_block_is_caught(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text(R.RESULTS_MD.read_text().replace("13 / 21 below", "12 / 21 below"))
    assert R.write(check=True, md=md) == 1


NUMBER = re.compile(r"(?<![\d.])[+-]?\d+\.\d+")


def test_every_number_of_the_study_summaries_is_printed_in_a_generated_block():
    """Each hand-written summary between '<!-- prose (X)' and '<!-- end prose (X) -->' quotes only
    numbers that a generated block of RESULTS.md prints (as written, sign included when given):
    prose cannot drift from the rows."""
    text = R.RESULTS_MD.read_text()
    blocks = " ".join(re.findall(r"<!-- generated:.*?-->(.*?)<!-- end generated", text, re.S))
    proses = re.findall(r"<!-- prose \((.+?)\).*?-->(.*?)<!-- end prose", text, re.S)
    assert proses, "no hand-written summary is marked in RESULTS.md"
    for name, prose in proses:
        missing = [n for n in NUMBER.findall(prose) if n not in blocks]
        assert not missing, f"summary {name}: numbers not in any generated block: {missing}"
