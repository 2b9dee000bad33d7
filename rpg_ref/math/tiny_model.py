"""The tiny Qwen3 (``--math-model tiny-qwen3``): Qwen3-0.6B's shared config shrunk to 2 layers of
width 64, randomly initialized (about 10M parameters, 9.7M of them the embedding). The real
vocabulary, so the real tokenizer and chat template work: the math pipeline on a CPU in seconds
(the math-cpu preset, the GPU benchmarks' --device cpu, the tests)."""

from __future__ import annotations

import json

from rpg_ref.math.data import data_dir

TINY_MODEL = "tiny-qwen3"


def tiny_qwen3_config() -> dict:
    d = json.loads((data_dir() / "models" / "qwen3-0.6b" / "config.json").read_text())
    d.update(num_hidden_layers=2, max_window_layers=2, hidden_size=64, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, intermediate_size=128)
    return d
