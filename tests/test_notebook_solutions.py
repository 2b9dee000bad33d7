"""The notebooks' exercises: every solution in notebooks/solutions.py runs and gives the answer
its exercise asks for, every exercise a notebook names has a solution, and every solution is
checked here (so an exercise whose solution stops working fails the suite).

Exact claims are checked to 1e-10 in float64; the training runs (marked slow) against the
margins their own tests use (tests/test_bandit_kl_direction.py, tests/test_sampler_lag.py); the
one Monte Carlo check at 4 standard errors (false-failure rate about 6e-5).
"""

import importlib.util
import inspect
import itertools
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_solutions():
    """notebooks/solutions.py by its path (notebooks/ is not an installed package)."""
    spec = importlib.util.spec_from_file_location("rpg_notebook_solutions",
                                                  ROOT / "notebooks" / "solutions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = _load_solutions()
EXACT = 1e-10


def check_ex01_1(r):
    assert abs(r["mean_k3"] - r["ukl"]) < EXACT
    # UKL(q||p) = sum q log(q/p) + sum (p - q): the mass term is what k3 adds to the plain sum
    assert abs(r["ukl"] - r["kl"] - r["mass_term"]) < EXACT and abs(r["mass_term"]) > 0.5


def check_ex01_2(r):
    assert abs(r["mean_k1"] - r["kl"]) < EXACT and abs(r["mean_k3"] - r["kl"]) < EXACT
    assert r["var_k3"] < 0.01 * r["var_k1"]  # O(delta^4) against O(delta^2)


def check_ex02_1(r):
    assert r["grpo"] < EXACT and r["grpo-corrected"] < EXACT


def check_ex02_2(r):
    assert r["rkl"] < 0.01 and r["fkl"] > 0.02, r


def check_ex03_1(r):
    assert max(r.values()) < EXACT, r


def check_ex03_2(r):
    assert max(r.values()) < EXACT, r


def check_ex04_1(r):
    assert abs(r["inside"] + 1.1) < EXACT  # d(-A w log pi)/d log pi with w = 1.1, A = 1
    assert r["beyond"] == 0.0


def check_ex04_2(r):
    assert abs(r["inside"] - 2.0) < EXACT  # -A w = 2 at w = 2, A = -1
    assert r["beyond"] == 0.0 and r["clip_frac_dual"] == 1.0


def check_ex05_1(r):
    tv = [r[b] for b in sorted(r)]
    assert all(a > b > 0 for a, b in itertools.pairwise(tv)), r


def check_ex05_2(r):
    assert r["p_best"] > 0.99, r


def check_ex06_1(r):
    assert "tok-rkl" in r["k2 without w"] and r["k2 with w"] == [], r


def check_ex06_2(r):
    assert all(r.values()), r


def check_ex07_1(r):
    assert r["error_at_cap"] < EXACT and r["error_just_below"] > 1e-6, r


def check_ex07_2(r):
    assert 0.8 < r["ratio_min"] and r["ratio_max"] < 1.28 and r["error"] < EXACT, r


def check_ex07_3(r):
    assert r["tv"] < 0.02, r


def check_ex08_1(r):
    """The numbers RESULTS.md's generated block for study C prints for this contrast."""
    text = (ROOT / "small_scale/RESULTS.md").read_text()
    block = text.split("--all (C) -->", 1)[1].split("<!-- end generated (C)", 1)[0]
    quoted = f"| URKL + clip > DAPO, 16 updates per batch | heldout | {r['n']} | "
    quoted += f"{r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] |"
    assert quoted in block, quoted


def check_ex08_2(r):
    assert r["power_at_n"] >= 0.8 > r["power_at_n_minus_1"]
    # the normal approximation n = ((z_0.975 + z_0.8) sd / delta)^2, which the t test needs a
    # little more than
    approx = ((1.959964 + 0.841621) * r["sd"] / 0.02) ** 2
    assert approx <= r["n"] <= approx + 3, (r, approx)


def check_ex08_3(r):
    m, alpha, families = 21, 0.05, 20_000
    expected = 1 - (1 - alpha / m) ** m  # independent nulls: P(min p <= alpha / m)
    assert abs(r["holm"] - expected) < 4 * math.sqrt(alpha * (1 - alpha) / families), r
    assert r["uncorrected"] > 0.6


SLOW = {"ex02_2", "ex05_2", "ex07_3"}  # a training run of the bandit preset each
SOLUTIONS = {name: fn for name, fn in inspect.getmembers(S, inspect.isfunction)
             if re.match(r"ex\d\d_\d_", name)}


def _key(name: str) -> str:
    return name[:6]


@pytest.mark.parametrize("name", sorted(n for n in SOLUTIONS if _key(n) not in SLOW))
def test_solution_answers_its_exercise(name):
    globals()[f"check_{_key(name)}"](SOLUTIONS[name]())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in SOLUTIONS if _key(n) in SLOW))
def test_solution_that_trains_answers_its_exercise(name):
    globals()[f"check_{_key(name)}"](SOLUTIONS[name]())


def test_every_exercise_has_a_solution_and_a_check():
    """The solutions the notebooks name are the functions of notebooks/solutions.py, each with a
    check above; every notebook names 2 or 3."""
    named = {}
    for py in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        found = re.findall(r"`(ex\d\d_\d_\w+)`", py.read_text())
        assert 2 <= len(found) <= 3, f"{py.name} names {len(found)} exercises"
        assert all(n.startswith(f"ex{py.name[:2]}_") for n in found), (py.name, found)
        named.update(dict.fromkeys(found))
    assert set(named) == set(SOLUTIONS)
    checks = {n.removeprefix("check_") for n in globals() if n.startswith("check_ex")}
    assert checks == {_key(n) for n in SOLUTIONS}
