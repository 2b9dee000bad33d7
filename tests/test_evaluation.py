"""Mean@k / Pass@k against hand-computed values, and rpg-eval end to end on a tiny random Qwen3."""
import json
import math
from fractions import Fraction

import pytest
from needs import needs_data
from tiny_runs import tiny_eval_argv

from rpg_ref.math import evaluation as ev
from rpg_ref.math.data import data_dir, load_problems
from rpg_ref.math.tiny_model import tiny_qwen3_config


# --------------------------------------------------------------------------- estimators
@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 2, 0.7),        # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 3, 0.9),        # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (4, 1, 1, 0.25),       # pass@1 = c/n
    (10, 0, 5, 0.0),       # nothing correct
    (5, 4, 2, 1.0),        # n - c < k: every draw of 2 contains a correct one
    (32, 32, 32, 1.0),
    (6, 3, 6, 1.0),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert ev.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_matches_the_exact_binomial_ratio_for_large_n():
    """The stable product equals 1 - C(n-c,k)/C(n,k) computed exactly with big integers."""
    for n, c, k in [(200, 3, 100), (200, 37, 16), (1000, 1, 999), (64, 10, 32)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert abs(ev.pass_at_k(n, c, k) - float(exact)) <= 1e-12, (n, c, k)


def test_mean_at_k_and_summary_by_hand():
    # two problems, n = 4: 3/4 and 1/4 correct
    rows = [[True, True, False, True], [False, False, True, False]]
    s = ev.summarize(rows, ks=[1, 2, 4])
    assert s["problems"] == 2 and s["n"] == 4
    assert s["mean@4"] == pytest.approx(0.5, abs=1e-15)        # (3/4 + 1/4) / 2
    assert s["mean@1"] == pytest.approx(0.5, abs=1e-15)
    # pass@2: problem 1: 1 - C(1,2)/C(4,2) = 1; problem 2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2
    assert s["pass@2"] == pytest.approx(0.75, abs=1e-15)
    assert s["pass@4"] == pytest.approx(1.0, abs=1e-15)
    table = ev.format_table({"toy": s})
    assert "toy" in table and "pass@2" in table and "0.7500" in table


def test_bad_estimator_inputs():
    with pytest.raises(ValueError, match="c=5"):
        ev.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=5"):
        ev.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="k=0"):
        ev.mean_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="same number of samples"):
        ev.summarize([[True], [True, False]], [1])
    with pytest.raises(ValueError, match="k=3"):
        ev.summarize([[True, False]], [3])


# --------------------------------------------------------------------------- scoring pipeline
def _need(path):
    if not path.exists():
        pytest.skip(f"{path} not found: set RPG_DATA_DIR to the shared data folder")


@needs_data("eval", "aime24.jsonl")
@needs_data("tokenizer", "qwen3")
def test_evaluate_sets_scores_decoded_responses():
    """evaluate_sets with a fake generator: 3 of 4 samples say the right AIME answer for problem 0,
    none for problem 1 -> mean@4 = 3/8, pass@4 = 1/2, pass@1 = 3/8."""
    tok_dir = data_dir() / "tokenizer" / "qwen3"
    _need(tok_dir)
    _need(data_dir() / "eval" / "aime24.jsonl")
    from transformers import AutoTokenizer

    from rpg_ref.math.reward import AnswerChecker
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    problems = load_problems("aime24", limit=2)
    assert [p.answer for p in problems] == ["204", "113"]
    texts = ["so\nAnswer: 204", "Answer: 204", "Answer: 205", "Answer: $204$"] + ["Answer: 0"] * 4
    calls = []

    def fake_generate(prompts, n):
        calls.append((len(prompts), n))
        return [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    with AnswerChecker("normalizer") as ck:
        res, details = ev.evaluate_sets(fake_generate, tok, {"aime24": problems}, 4, [1, 4],
                                        "answer", False, ck)
    assert calls == [(2, 4)]
    r = res["aime24"]
    assert r["mean@4"] == pytest.approx(3 / 8, abs=1e-15) and r["pass@1"] == pytest.approx(
        3 / 8, abs=1e-15
    )
    assert r["pass@4"] == pytest.approx(0.5, abs=1e-15)
    assert [d["correct"] for d in details["aime24"]] == [3, 0]


# --------------------------------------------------------------------------- rpg-eval CLI
def _tiny_qwen3(tmp_path):
    """A 2-layer, hidden-64 Qwen3 with random weights and the real vocabulary, saved with the real
    tokenizer (about 10M parameters, 40 MB)."""
    cfg_path = data_dir() / "models" / "qwen3-0.6b" / "config.json"
    tok_dir = data_dir() / "tokenizer" / "qwen3"
    _need(cfg_path)
    _need(tok_dir)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config
    cfg = {**tiny_qwen3_config(), "torch_dtype": "float32"}
    cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**cfg))
    out = tmp_path / "tiny-qwen3"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(tok_dir)).save_pretrained(out)
    return out


@needs_data("eval", "aime24.jsonl")
@needs_data("tokenizer", "qwen3")
@needs_data("models", "qwen3-0.6b")
def test_rpg_eval_runs_on_a_tiny_random_qwen3(tmp_path, capsys):
    _need(data_dir() / "eval" / "aime24.jsonl")
    model_dir = _tiny_qwen3(tmp_path)
    out = tmp_path / "eval.json"
    rc = ev.main(tiny_eval_argv(model_dir, out, data=("aime24", "aime25"), max_new_tokens=6,
                                batch_size=4, device="cpu"))
    assert rc == 0
    printed = capsys.readouterr().out
    assert "aime24" in printed and "aime25" in printed and "pass@2" in printed
    res = json.loads(out.read_text())
    for name in ("aime24", "aime25"):
        r = res["results"][name]
        assert r["problems"] == 2 and r["n"] == 2 and 0.0 <= r["mean@2"] <= r["pass@2"] <= 1.0
        assert r["check_stats"]["checked"] == 4
        assert 1 <= r["mean_response_tokens"] <= 6
        assert len(res["problems"][name]) == 2


def test_rpg_eval_rejects_bad_arguments(tmp_path, capsys):
    assert ev.main(["--model", str(tmp_path), "--data", "aime24", "--n", "4", "--k", "8"]) == 2
    assert "--k values" in capsys.readouterr().err
    assert ev.main(["--model", str(tmp_path / "none"), "--data", "aime24"]) == 2
    assert "is not a folder" in capsys.readouterr().err
