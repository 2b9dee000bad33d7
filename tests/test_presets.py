"""The full-scale presets: valid trainer fields, and the paper's numbers
(app:detailed_exp_setup_choices)."""
import dataclasses

import pytest

from rpg_ref.trainer.presets import PAPER_HPARAMS, PRESETS


def test_presets_use_only_trainer_config_fields_and_registered_options(tmp_path):
    """Every preset key is a Config field or a registered task's/engine's option flag, and every
    preset parses into a valid configuration."""
    cli = pytest.importorskip("rpg_ref.cli")
    from rpg_ref.trainer.config import Config, plugin_options

    fields = {f.name for f in dataclasses.fields(Config)} | set(plugin_options())
    for name, p in PRESETS.items():
        assert set(p) <= fields, (name, set(p) - fields)
        cfg = cli.parse_config(["--preset", name, "--out", str(tmp_path / name)])
        assert cfg.preset == name


def test_qwen3_4b_h100_is_the_papers_recipe_on_one_gpu():
    p = PRESETS["qwen3-4b-h100"]
    assert (p["lr"], p["weight_decay"], p["grad_clip"], p["steps"], p["warmup_steps"]) == (
        1e-6,
        0.1,
        1.0,
        400,
        10,
    )
    assert (p["prompts_per_step"], p["group_size"], p["temperature"], p["beta"]) == (
        512,
        16,
        1.0,
        1e-4,
    )
    assert p["clip"][:2] == [0.2, 0.28] and p["ref"] == "iterative"
    # 512 x 16 responses per rollout batch / 512 per optimizer step = 16 optimizer steps, as on 8
    # GPUs
    assert p["prompts_per_step"] * p["group_size"] // p["mini_batch_size"] == 16
    assert p["mini_batch_size"] % p["micro_batch_size"] == 0
    assert [PRESETS[f"qwen3-4b-h100{s}"]["max_new_tokens"] for s in ("", "-4k", "-8k")] == \
        list(PAPER_HPARAMS["response_lengths"])


def test_a_task_without_a_preset_of_its_own_is_refused_without_preset(monkeypatch):
    """A registered task with no preset named like it: `--task NAME` alone is one line asking for
    --preset (the default preset's max-new-tokens, lr and clip were made for another task); with
    --preset the run is configured from the preset named."""
    from rpg_ref import cli
    from rpg_ref.registry import TASKS

    monkeypatch.setitem(TASKS, "mine", "rpg_ref.tasks.seq:SeqTask")
    with pytest.raises(ValueError, match=r"task 'mine' has no preset of its own.*--preset NAME"):
        cli.parse_config(["--task", "mine"])
    cfg = cli.parse_config(["--task", "mine", "--preset", "seq", "--out", "unused"])
    assert (cfg.task, cfg.preset, cfg.lr) == ("mine", "seq", PRESETS["seq"]["lr"])
    with pytest.raises(ValueError, match="unknown task"):
        cli.parse_config(["--task", "chess"])
