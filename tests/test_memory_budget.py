"""small_scale/bench/memory_budget.py: its parameter count is the real model's, its KV size the
formula's."""
import json

import pytest
import torch
from needs import needs_data

from rpg_ref.math.data import data_dir
from small_scale.bench import memory_budget as mb


@needs_data("models")
@pytest.mark.parametrize("name", ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b"])
def test_param_count_equals_the_instantiated_model(name):
    """The analytic count equals sum(p.numel()) of the HF model built on the meta device (no
    memory)."""
    path = data_dir() / "models" / name / "config.json"
    if not path.is_file():
        pytest.skip(f"{path} not found: set RPG_DATA_DIR to the shared data folder")
    transformers = pytest.importorskip("transformers")
    cfg = json.loads(path.read_text())
    hf_cfg = transformers.Qwen3Config(
        **{k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")}
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert mb.param_count(cfg)["total"] == sum(p.numel() for p in model.parameters())


@needs_data("models", "qwen3-4b")
def test_kv_cache_bytes_and_the_4b_budget_fits():
    path = data_dir() / "models" / "qwen3-4b" / "config.json"
    if not path.is_file():
        pytest.skip(f"{path} not found: set RPG_DATA_DIR to the shared data folder")
    cfg = json.loads(path.read_text())
    # layers x (K, V) x kv heads x head_dim x bf16
    assert mb.kv_bytes_per_token(cfg) == 36 * 2 * 8 * 128 * 2
    for resp in (2048, 4096, 8192):
        b = mb.budget(cfg, 80.0, 1024, resp, 1024, 8, 2.0, 1.0, 3.0)
        assert b["train_total"] < 80 * mb.GiB
        assert b["rollout_offload"]["KV cache"] > 0 and b["rollout_resident"]["KV cache"] > 0
    assert mb.bf16_loses_small_updates() == (True, False)


@needs_data("models", "qwen3-4b")
def test_chunked_lm_head_makes_qwen3_4b_at_8k_fit_by_the_estimate():
    """The estimate for the qwen3-4b-h100-8k preset (8,192-token responses, 1,024-token prompts,
    micro-batch 1): with the LM head in the trainer's automatic chunks (512 MiB of fp32 logits =
    883 tokens of Qwen3's 151,936-word vocabulary) the training phase fits in 80 GiB with either
    engine; with the whole response's logits at once (the trainer before chunking) it does not.
    An estimate, not a measurement (docs/memory_budget_qwen3_4b_h100.md)."""
    path = data_dir() / "models" / "qwen3-4b" / "config.json"
    if not path.is_file():
        pytest.skip(f"{path} not found: set RPG_DATA_DIR to the shared data folder")
    cfg = json.loads(path.read_text())
    assert mb.auto_logit_chunk(cfg) == 883 == (512 * 2**20) // (4 * 151936)
    for engine in ("vllm", "hf"):
        chunked = mb.budget(cfg, 80.0, 1024, 8192, 0, 8, 2.0, 1.0, 3.0, engine=engine)
        whole = mb.budget(cfg, 80.0, 1024, 8192, 0, 8, 2.0, 1.0, 3.0, engine=engine, unchunked=True)
        assert chunked["train_total"] < 80 * mb.GiB < whole["train_total"], engine
    assert (
        mb.budget(cfg, 80.0, 1024, 8192, 0, 8, 2.0, 1.0, 3.0, engine="hf")["rollout_hf"][
            "concurrent_seqs"
        ]
        >= 1
    )
