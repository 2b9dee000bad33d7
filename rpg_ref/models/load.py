"""A causal LM and its tokenizer from Hugging Face files, and back to them.

    load_hf_model      a checkpoint folder or hub id (pretrained weights), or a config.json (file,
                       or a folder holding only one) for a randomly initialized model
    resolve_tokenizer  the model's own tokenizer when its folder has one, else a fallback folder
    load_tokenizer     AutoTokenizer, its failures as one ValueError
    export_model       save_pretrained of the wrapped model + the tokenizer (what rpg-eval and
                       vLLM load)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from rpg_ref.models.policy import HFPolicy

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def load_hf_model(spec: str, dtype: str = "float32", attn_implementation: str = "sdpa",
                  device: str | torch.device = "cpu") -> nn.Module:
    """A causal LM from a checkpoint folder / hub id (pretrained), or from a config.json file or a
    folder holding a config.json but no weights (random initialization from torch's global RNG,
    on ``device``: a 4B model initializes in seconds on a GPU, in a minute on a CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    path = Path(spec)
    config_file = path if path.is_file() else path / "config.json"
    if path.is_file() or (path.is_dir() and not any((path / w).exists() for w in WEIGHT_FILES)):
        if not config_file.is_file():
            raise ValueError(f"{spec!r}: a folder without weights needs a config.json")
        try:
            d = json.loads(config_file.read_text())
            mcfg = AutoConfig.for_model(d.pop("model_type"), **d)
        except (json.JSONDecodeError, KeyError, ValueError) as e:
            raise ValueError(f"{spec!r}: not a usable model config.json ({e})") from e
        with torch.device(device):
            return AutoModelForCausalLM.from_config(mcfg, dtype=torch_dtype,
                                                    attn_implementation=attn_implementation)
    try:
        return AutoModelForCausalLM.from_pretrained(spec, dtype=torch_dtype,
                                                    attn_implementation=attn_implementation)
    except OSError as e:
        raise ValueError(f"{spec!r}: not a checkpoint folder, config.json or a "
                         f"reachable Hugging Face model id ({e})") from e


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"not a usable tokenizer ({e})") from e


def resolve_tokenizer(model_spec: str, fallback: Path) -> str:
    """The model's own tokenizer when its folder has one, else ``fallback`` (a tokenizer folder);
    a hub id keeps its own tokenizer."""
    p = Path(model_spec)
    folder = p.parent if p.is_file() else p
    if not folder.is_dir():
        return model_spec
    if (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists():
        return str(folder)
    if not fallback.is_dir():
        raise ValueError(
            f"{model_spec!r} has no tokenizer and the fallback tokenizer {fallback} is "
            f"absent: pass a tokenizer"
        )
    return str(fallback)


def export_model(policy: nn.Module, tokenizer, dest: Path) -> Path:
    """save_pretrained of the wrapped model + the tokenizer files into ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    model = policy.module if isinstance(policy, HFPolicy) else policy
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest
