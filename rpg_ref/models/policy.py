"""HFPolicy: a Hugging Face causal LM wrapped for the trainer, with a precision choice and
gradient checkpointing (what the memory budget needs, docs/memory_budget_qwen3_4b_h100.md),
without any change to the training loop."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from rpg_ref.models.logprobs import LMParts, hf_lm_parts

DTYPES = ("float32", "bf16-autocast", "bfloat16")


class HFPolicy(nn.Module):
    """A Hugging Face causal LM with the trainer's calling convention plus two memory options.

    dtype "float32": parameters and compute in fp32 (CPU default; exact).
    dtype "bf16-autocast": fp32 parameters (the optimizer's master weights: an AdamW step of
        lr 1e-6 on a weight of size 0.02 survives, which it would not on a bf16 weight whose grid
        spacing there is 6e-5) and bf16 matrix products under torch.autocast, in training
        forwards, log-prob passes and HF generation alike.
    dtype "bfloat16": parameters in bf16 (half the memory; small updates are lost to rounding).
    gradient_checkpointing: decoder layers keep only their inputs and recompute their
        activations in the backward pass. HF checkpoints a layer only while it is in training
        mode, but the trainer keeps the policy in eval mode (no dropout, so w = 1 exactly before
        the first update); the layers are therefore switched to training mode for the duration
        of a forward with gradients enabled. Only the layer objects' own flag changes, so
        attention dropout (read from the attention module's flag) stays off.

    The wrapped model is ``self.module``: parameter names gain a ``module.`` prefix (as under
    DDP), which rpg_ref.engines.vllm strips before loading weights into vLLM.
    """

    def __init__(
        self, model: nn.Module, dtype: str = "float32", gradient_checkpointing: bool = False
    ):
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.module = model
        self.autocast = dtype == "bf16-autocast"
        self.grad_ckpt = gradient_checkpointing
        self._ckpt_layers = []
        if gradient_checkpointing:
            kw = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
                model.activation_checkpointing_enable(kw)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
            from transformers.modeling_layers import GradientCheckpointingLayer

            self._ckpt_layers = [
                m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)
            ]
            if not self._ckpt_layers:
                raise ValueError(f"{type(model).__name__} has no checkpointable layers")

    # what the trainer, the engines and save/export read from an HF model
    @property
    def config(self):
        return self.module.config

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def save_pretrained(self, *args, **kwargs):
        return self.module.save_pretrained(*args, **kwargs)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    @contextlib.contextmanager
    def _compute(self):
        """bf16 autocast when asked; checkpointed layers in training mode while gradients are on."""
        ckpt = self.grad_ckpt and torch.is_grad_enabled()
        for layer in self._ckpt_layers if ckpt else ():
            layer.training = True
        try:
            with self._autocast():
                yield
        finally:
            for layer in self._ckpt_layers if ckpt else ():
                layer.training = False

    def forward(self, *args, **kwargs):
        # a single forward pass keeps no KV cache (HF's default use_cache=True would allocate one)
        if "past_key_values" not in kwargs and "cache" not in kwargs:
            kwargs.setdefault("use_cache", False)
        with self._compute():
            return self.module(*args, **kwargs)

    def lm_parts(self) -> LMParts | None:
        """Hidden states and LM head of the wrapped model, each in this policy's precision and
        checkpointing (rpg_ref.models.logprobs applies the head in chunks), or None if it has no
        plain head."""
        parts = hf_lm_parts(self.module)
        if parts is None:
            return None

        def hidden(**inputs):
            with self._compute():
                return parts.hidden(**inputs)

        def head(h):
            with self._autocast():
                return parts.head(h)

        return LMParts(hidden, head, parts.vocab_size)

    def generate(self, *args, **kwargs):
        with self._autocast():
            return self.module.generate(*args, **kwargs)
