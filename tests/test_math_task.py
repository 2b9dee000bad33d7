"""The math task (rpg_ref/tasks/math.py) on a tiny random Qwen3 with the real Qwen3 tokenizer and
the real AIME/AMC problems: end-to-end training, resume, export, rpg-eval; prompts, rewards, the
policy wrapper's precision and gradient checkpointing; refusals of bad options."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tiny_runs import tiny_eval_argv, tiny_math_argv

from rpg_ref import cli
from rpg_ref.interfaces import Prompt
from rpg_ref.math.data import data_dir
from rpg_ref.math.tiny_model import tiny_qwen3_config

CONFIG = data_dir() / "models" / "qwen3-0.6b" / "config.json"
TOKENIZER = data_dir() / "tokenizer" / "qwen3"
NEEDED = [
    CONFIG,
    TOKENIZER,
    data_dir() / "eval" / "aime24.jsonl",
    data_dir() / "eval" / "amc23.jsonl",
]
pytestmark = pytest.mark.skipif(
    not all(p.exists() for p in NEEDED),
    reason=f"shared data absent ({', '.join(str(p) for p in NEEDED if not p.exists())}): set "
    f"RPG_DATA_DIR to the folder holding eval/, models/ and tokenizer/",
)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> str:
    """rpg_ref.math.tiny_model.tiny_qwen3_config: Qwen3-0.6B's config shrunk to 2 layers, width 64,
    with the real vocabulary, so the real tokenizer and chat template work."""
    path = tmp_path_factory.mktemp("tiny") / "tiny-qwen3.json"
    path.write_text(json.dumps(tiny_qwen3_config()))
    return str(path)


def _cfg(tiny_config, tmp_path, **settings):
    return cli.parse_config(tiny_math_argv(tiny_config, tmp_path / "run", **settings))


def _assert_same_weights(exported: dict, trained: dict) -> None:
    """HF export (tied embeddings saved once, as embed_tokens) == trainer checkpoint (HFPolicy's
    names, prefix "module.", the tied tensor saved once as lm_head)."""
    assert len(exported) == len(trained)
    for name, t in exported.items():
        key = "module." + name
        if key not in trained and name == "model.embed_tokens.weight":
            key = "module.lm_head.weight"
        assert torch.equal(t, trained[key]), name


def _rows(out: Path) -> list:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------
# end to end: 2 steps, resume, export, rpg-eval
# ------------------------------------------------------------------------------------------


def test_math_task_trains_two_steps_resumes_exports_and_rpg_eval_runs(
    tiny_config, tmp_path, capsys
):
    """`rpg-train --task math` runs 2 steps on the tiny random Qwen3 (real tokenizer, AMC23
    training problems, AIME24 evaluation): metrics.jsonl holds steps 1 and 2 with finite values,
    the evaluation at the last step logs Mean@k / Pass@k, a checkpoint and the HF export exist
    and hold the same weights; `--resume` adds step 3; `rpg-eval` runs on the export; the export
    command rebuilds the same weights from the trainer checkpoint."""
    from safetensors.torch import load_file

    from rpg_ref.export import main as export_main
    from rpg_ref.math import evaluation

    out = tmp_path / "run"
    assert cli.main(tiny_math_argv(tiny_config, out)) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        bad = {k: v for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"non-finite metrics at step {r['step']}: {bad}"
        # 4 random tokens never hold an "Answer:" line: every response scores -1 (pm1), so the
        # group baseline gives zero advantages and the surrogate loss is exactly 0
        assert r["reward"] == -1.0 and r["accuracy"] == 0.0 and r["response_len"] == 4.0, r
        assert r["updates"] == 2 and r["loss"] == 0.0
        assert r["logprob_diff_max"] < 1e-4
    for key in (
        "eval_aime24_mean@1",
        "eval_aime24_pass@1",
        "eval_aime24_mean@2",
        "eval_aime24_pass@2",
    ):
        assert key in rows[1] and 0.0 <= rows[1][key] <= 1.0, key
    assert rows[1]["eval_aime24_response_len"] == 4.0
    ckpt = out / "checkpoints" / (out / "checkpoints" / "LATEST").read_text().strip()
    assert ckpt.name == "step_000002" and (ckpt / "model.safetensors").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train_problems"] == 40 and summary["train_problems_dropped_long_prompt"] == 0
    assert summary["hf_export"] == str(out / "hf")

    exported = load_file(out / "hf" / "model.safetensors")
    _assert_same_weights(exported, load_file(ckpt / "model.safetensors"))

    # resume: one more step, the stored config (task options included) is reused
    assert cli.main(["--resume", str(out), "--steps", "3", "--no-progress"]) == 0
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]

    # rpg-eval on the exported checkpoint (config, weights and tokenizer in OUT/hf)
    capsys.readouterr()
    res_path = tmp_path / "eval.json"
    assert (
        evaluation.main(tiny_eval_argv(out / "hf", res_path, max_new_tokens=4, device="cpu"))
        == 0
    )
    assert "amc23" in capsys.readouterr().out
    r = json.loads(res_path.read_text())["results"]["amc23"]
    assert r["problems"] == 2 and r["n"] == 2 and r["check_stats"]["checked"] == 4

    # the export command: trainer checkpoint (now step 3) -> HF folder with the same weights
    assert export_main([str(out), str(tmp_path / "exp")]) == 0
    again = load_file(tmp_path / "exp" / "model.safetensors")
    assert again.keys() == exported.keys()
    _assert_same_weights(
        again, load_file(out / "checkpoints" / "step_000003" / "model.safetensors")
    )
    assert export_main([str(tmp_path / "nothing")]) == 2


# ------------------------------------------------------------------------------------------
# prompts and rewards
# ------------------------------------------------------------------------------------------


def test_prompts_are_chat_template_prompts_of_distinct_training_problems(tiny_config, tmp_path):
    """sample_prompts(n) draws n distinct training problems from the trainer's generator (same
    seed -> same draw); each prompt is the chat template of the paper's instruction + problem +
    reminder, ending with Qwen3's non-thinking assistant header; --math-prompt boxed gives the
    \\boxed{} variant and --math-enable-thinking drops the empty think block."""
    from rpg_ref.math.reward import PAPER_INSTRUCTION, PAPER_REMINDER
    from rpg_ref.tasks.math import MathTask

    task = MathTask(_cfg(tiny_config, tmp_path, math_eval_n=0), torch.device("cpu"))
    ps = task.sample_prompts(8, torch.Generator().manual_seed(3))
    again = task.sample_prompts(8, torch.Generator().manual_seed(3))
    assert [p.ids for p in ps] == [p.ids for p in again]
    golds = {p.problem: p.answer for p, _ in task.train}
    texts = [task.tokenizer.decode(p.ids) for p in ps]
    assert len(set(texts)) == 8
    for p, text in zip(ps, texts):
        assert text.startswith("<|im_start|>user\n" + PAPER_INSTRUCTION + "\n\n")
        assert text.endswith(
            PAPER_REMINDER + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )
        problem = text[len("<|im_start|>user\n" + PAPER_INSTRUCTION + "\n\n") :].split(
            "\n\n" + PAPER_REMINDER
        )[0]
        assert golds[problem] == p.answer
    boxed = MathTask(_cfg(tiny_config, tmp_path, math_eval_n=0, math_prompt="boxed",
                          math_enable_thinking=True), torch.device("cpu"))
    text = boxed.tokenizer.decode(boxed.sample_prompts(1, torch.Generator().manual_seed(0))[0].ids)
    assert "\\boxed{answer}" in text and PAPER_INSTRUCTION not in text
    assert text.endswith("<|im_start|>assistant\n")


def test_summary_writes_nothing_and_finish_exports_and_stops_the_workers(tiny_config, tmp_path):
    """summary() only reports (OUT/hf named, not written); finish(policy, OUT) writes the HF
    export in OUT/hf and stops the answer-checker workers (started here by one reward call)."""
    from rpg_ref.tasks.math import MathTask

    cfg = _cfg(tiny_config, tmp_path, math_eval_n=0)
    task = MathTask(cfg, torch.device("cpu"))
    policy = task.build_policy()
    task.reward([Prompt(ids=[0], answer="1")], [task.tokenizer("Answer: 1")["input_ids"]])
    assert task.scorer.checker._workers
    out = Path(cfg.out)
    assert task.summary(policy, cfg)["hf_export"] == str(out / "hf")
    assert not (out / "hf").exists()
    task.finish(policy, out)
    assert (out / "hf" / "config.json").is_file() and (out / "hf" / "model.safetensors").is_file()
    assert not task.scorer.checker._workers


@pytest.mark.parametrize("scoring,right,wrong", [("pm1", 1.0, -1.0), ("binary", 1.0, 0.0)])
def test_reward_of_decoded_responses(tiny_config, tmp_path, scoring, right, wrong):
    """task.reward decodes token ids with the real tokenizer and checks the final answer: the gold
    answer on the last 'Answer:' line (AMC23's float golds such as 27.0 written as integers, with
    the EOS token kept) scores `right`, a wrong number or no answer line scores `wrong`;
    correct is True exactly for the former."""
    from rpg_ref.tasks.math import MathTask

    task = MathTask(_cfg(tiny_config, tmp_path, math_eval_n=0, math_scoring=scoring),
                    torch.device("cpu"))
    probs = [p for p, _ in task.train[:6]]
    tok = task.tokenizer
    texts = []
    for p in probs:
        g = int(float(p.answer))
        texts += [f"We compute.\nAnswer: {g}", f"Answer: {g + 1}", "I do not know."]
    responses = [tok(t, add_special_tokens=False)["input_ids"] + [task.eos_id] for t in texts]
    prompts = [Prompt(ids=[0], answer=p.answer) for p in probs for _ in range(3)]
    r, correct = task.reward(prompts, responses)
    assert r.tolist() == [right, wrong, wrong] * 6
    assert correct.tolist() == [True, False, False] * 6


# ------------------------------------------------------------------------------------------
# the policy wrapper: precision and gradient checkpointing
# ------------------------------------------------------------------------------------------


def _loss_and_grads(policy, ids):
    policy.zero_grad(set_to_none=True)
    out = policy(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=ids.shape[1])
    loss = torch.log_softmax(out.logits.float(), -1)[0, :-1].gather(-1, ids[0, 1:, None]).sum()
    loss.backward()
    return out.logits, {n: p.grad.clone() for n, p in policy.named_parameters()}


def test_gradient_checkpointing_recomputes_layers_in_eval_mode_with_identical_gradients(
    tiny_config,
):
    """With --math-gradient-checkpointing each decoder layer runs forward twice per
    forward+backward (once more in the backward recompute) although the trainer keeps the policy
    in eval mode, and the gradients are bitwise those without checkpointing (CPU, same kernels)."""
    from rpg_ref.models.load import load_hf_model
    from rpg_ref.models.policy import HFPolicy

    torch.manual_seed(0)
    model = load_hf_model(tiny_config)
    ids = torch.tensor([[785, 3974, 13876, 38835, 34208, 916, 279, 15678]])
    counts = []
    for ckpt in (False, True):
        policy = HFPolicy(model, "float32", gradient_checkpointing=ckpt).eval()
        calls = [0]

        def count(*_, calls=calls):
            calls[0] += 1

        # a pre-hook: the recompute stops early, right after the last saved tensor, so a
        # post-forward hook of the layer's last block would not see it
        hook = model.model.layers[0].mlp.register_forward_pre_hook(count)
        _, grads = _loss_and_grads(policy, ids)
        hook.remove()
        counts.append(calls[0])
        if not ckpt:
            ref = grads
        assert not any(m.training for m in policy.modules()), "the policy must stay in eval mode"
    assert counts == [1, 2]
    for n, g in grads.items():
        assert torch.equal(g, ref[n]), n


def test_bf16_autocast_computes_in_bf16_and_keeps_fp32_weights(tiny_config):
    """--math-dtype bf16-autocast: parameters (the optimizer's master weights) stay float32 and
    the forward's matrix products run in bf16 (bf16 logits), in generation too; float32 computes
    float32 logits; --math-dtype bfloat16 stores bf16 parameters."""
    from rpg_ref.models.load import load_hf_model
    from rpg_ref.models.policy import HFPolicy

    torch.manual_seed(0)
    ids = torch.tensor([[785, 3974, 13876, 38835]])
    model = load_hf_model(tiny_config)
    fp32, _ = _loss_and_grads(HFPolicy(model, "float32").eval(), ids)
    auto = HFPolicy(model, "bf16-autocast").eval()
    logits, grads = _loss_and_grads(auto, ids)
    assert fp32.dtype == torch.float32 and logits.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in auto.parameters())
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads.values())
    seq = auto.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                        do_sample=False, pad_token_id=0)
    assert seq.shape == (1, 6)
    assert all(
        p.dtype == torch.bfloat16 for p in load_hf_model(tiny_config, "bfloat16").parameters()
    )


# ------------------------------------------------------------------------------------------
# the math-cpu preset
# ------------------------------------------------------------------------------------------


def test_math_cpu_preset_runs_the_tiny_qwen3_on_real_problems(tmp_path, capsys):
    """`rpg-train --preset math-cpu` (here one step, 8 tokens, 2 evaluation problems) builds the
    tiny Qwen3 from the shared 0.6B config (2 layers of width 64, the real vocabulary), tokenizes
    real training problems with the real tokenizer, trains, evaluates Mean@k / Pass@k on AMC23 and
    saves a checkpoint and the HF export."""
    from transformers import AutoConfig

    out = tmp_path / "run"
    assert (
        cli.main(
            [
                "--preset",
                "math-cpu",
                "--steps",
                "1",
                "--math-eval-limit",
                "2",
                "--no-progress",
                "--max-new-tokens",
                "8",
                "--overlong-buffer",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (row,) = _rows(out)
    assert row["step"] == 1 and row["accuracy"] == 0.0 and -2.0 <= row["reward"] <= 1.0
    # the last line says why: a random model cannot solve math
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == ("note: --math-model tiny-qwen3 is a random 2-layer model: it cannot solve "
                    "math (its text holds no answer and never ends), so reward -2 (a wrong answer "
                    "-1, overlong -1) and accuracy 0 are what it gets; this run checks the "
                    "pipeline, not the learning"), last
    assert 1 <= row["response_len"] <= 8
    for key in ("eval_amc23_mean@1", "eval_amc23_pass@1", "eval_amc23_mean@2", "eval_amc23_pass@2"):
        assert 0.0 <= row[key] <= 1.0, key
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train_problems"] == 256
    shared = json.loads(CONFIG.read_text())
    exported = AutoConfig.from_pretrained(out / "hf")
    assert (exported.num_hidden_layers, exported.hidden_size) == (2, 64)
    assert exported.vocab_size == shared["vocab_size"]
    assert (out / "hf" / "tokenizer.json").is_file() and (out / "checkpoints" / "LATEST").is_file()


def test_math_cpu_preset_without_the_shared_data_is_one_line(tmp_path, monkeypatch, capsys):
    """Without the shared data (RPG_DATA_DIR pointing at an empty folder) math-cpu is refused in
    one line that names RPG_DATA_DIR, with exit code 2 and nothing written."""
    monkeypatch.setenv("RPG_DATA_DIR", str(tmp_path / "empty"))
    out = tmp_path / "run"
    assert cli.main(["--preset", "math-cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RPG_DATA_DIR" in err[0], err
    assert not out.exists()


# ------------------------------------------------------------------------------------------
# refusals
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings,msg", [
    ({"math_prompt": "xml"}, "--math-prompt must be one of"),
    ({"math_scoring": "ternary"}, "--math-scoring must be one of"),
    ({"math_dtype": "fp8"}, "--math-dtype must be one of"),
    ({"math_eval_k": "4"}, r"--math-eval-k values must be in \[1, --math-eval-n 2\]"),
    ({"math_eval_temperature": "0"}, "greedy"),
    ({"math_train_limit": "1"}, "1 usable problems .* < --prompts-per-step 2"),
    ({"math_max_prompt_tokens": "10"}, "40 dropped as longer than 10 prompt tokens"),
    ({"math_train_data": "no/such.jsonl"}, "does not exist"),
])
def test_bad_math_options_are_refused_before_any_work(tiny_config, tmp_path, settings, msg):
    from rpg_ref.tasks.math import MathTask

    with pytest.raises(ValueError, match=msg):
        MathTask(_cfg(tiny_config, tmp_path, **settings), torch.device("cpu"))


def test_bad_model_is_refused(tiny_config, tmp_path):
    """A folder with neither weights nor config.json, and a config whose vocabulary is smaller
    than the tokenizer's, are refused with a message naming the problem."""
    from rpg_ref.tasks.math import MathTask

    (tmp_path / "empty").mkdir()
    task = MathTask(
        _cfg(tiny_config, tmp_path, math_eval_n=0, math_model=tmp_path / "empty",
             math_tokenizer=TOKENIZER),
        torch.device("cpu"),
    )
    with pytest.raises(ValueError, match=r"needs a config\.json"):
        task.build_policy()
    small = json.loads(Path(tiny_config).read_text()) | {"vocab_size": 1000}
    (tmp_path / "small.json").write_text(json.dumps(small))
    task = MathTask(_cfg(tiny_config, tmp_path, math_eval_n=0,
                         math_model=tmp_path / "small.json"), torch.device("cpu"))
    with pytest.raises(
        ValueError, match="151669 tokens but the model's embedding has only 1000 rows"
    ):
        task.build_policy()


# ------------------------------------------------------------------------------------------
# registration in the trainer, and the vLLM engine's view of the policy
# ------------------------------------------------------------------------------------------


def test_trainer_registers_math_and_vllm_and_the_math_presets_are_the_papers_recipe():
    """rpg-train resolves --task math and --engine vllm (the class, importable without vLLM); the
    math presets are the paper's recipe (presets.PAPER_RECIPE) at 2K/4K/8K, and `math` is it on the
    task's default engine."""
    from rpg_ref.engines.vllm import VLLMEngine
    from rpg_ref.registry import ENGINES, TASKS, resolve
    from rpg_ref.tasks.math import MathTask
    from rpg_ref.trainer.presets import PAPER_RECIPE, PRESETS

    assert resolve(TASKS, "math", "task") is MathTask
    assert resolve(ENGINES, "vllm", "engine") is VLLMEngine
    for name in ("qwen3-4b-h100", "qwen3-4b-h100-4k", "qwen3-4b-h100-8k"):
        assert {k: v for k, v in PRESETS[name].items() if k != "max_new_tokens"} == PAPER_RECIPE
    assert PRESETS["qwen3-4b-h100"]["engine"] == "vllm" and "engine" not in PRESETS["math"]


def test_vllm_weight_names_of_the_wrapped_policy_are_the_hf_names(tiny_config):
    """The vLLM engine's weight mapping turns HFPolicy's parameter names ("module." + HF name)
    back into the HF checkpoint's names that vLLM's load_weights expects (tied lm_head dropped)."""
    from rpg_ref.engines.vllm import hf_to_vllm_weights
    from rpg_ref.models.load import load_hf_model
    from rpg_ref.models.policy import HFPolicy

    model = load_hf_model(tiny_config)
    names = [n for n, _ in hf_to_vllm_weights(HFPolicy(model).named_parameters(), True)]
    assert names == [n for n, _ in model.named_parameters()]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


@pytest.mark.parametrize("argv", [["-m", "rpg_ref.export"], ["-m", "rpg_ref.tasks.math", "export"]])
def test_export_command_refuses_a_folder_that_is_no_run(tmp_path, argv):
    """Both spellings of the export command (`python -m rpg_ref.export OUT`, and the older
    `python -m rpg_ref.tasks.math export OUT`) run the same export: on a folder without a run's
    config.json and checkpoint they print one error line naming the folder and exit 2, writing
    nothing."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, *argv, str(tmp_path)], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"export: error: {tmp_path}: not a run folder with a checkpoint (need config.json and "
        "checkpoints/LATEST)"
    ]
    assert list(tmp_path.iterdir()) == []
