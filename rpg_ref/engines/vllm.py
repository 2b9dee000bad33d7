"""A colocated vLLM rollout engine: one GPU shared by generation and training.

Supported vLLM: SUPPORTED_VLLM = ">=0.10.2,<0.12" (V1 engine). Only vLLM's documented RLHF surface
is used (vLLM's offline_inference/rlhf_* examples and the sleep-mode docs of that range):
    LLM(model, enable_sleep_mode=True,
    worker_extension_cls="rpg_ref.engines.vllm.RPGWorkerExtension",
        gpu_memory_utilization, seed, logprobs_mode="processed_logprobs")
    llm.generate(TokensPrompt(prompt_token_ids), SamplingParams(n, temperature, top_p, max_tokens,
                 logprobs=0, seed))                       # logprobs=0: the sampled token's log-prob
                 only
    llm.sleep(level=1) / llm.wake_up(tags=["weights"]) / llm.wake_up(tags=["kv_cache"])
    llm.collective_rpc("rpg_load_weights", args=(chunk,)) -> the worker extension calls
        self.model_runner.model.load_weights(weights=chunk)
    llm.reset_prefix_cache()                              # cached KV of the old weights is invalid
The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0 is set before LLM() unless
`in_process=False`), so collective_rpc hands the trainer's GPU tensors to the worker by reference.

Weight names: vLLM's Qwen2/Qwen3 `load_weights` takes Hugging Face parameter names and itself packs
q/k/v_proj into its fused qkv_proj and gate/up_proj into gate_up_proj (its stacked_params_mapping),
so `hf_to_vllm_weights` only strips wrapper prefixes (DDP "module.", torch.compile "_orig_mod.",
activation checkpointing "_checkpoint_wrapped_module.", FSDP "_fsdp_wrapped_module.") and drops
lm_head.weight when the embeddings are tied (vLLM ties lm_head to embed_tokens and skips it).

Step protocol (EngineStateMachine, enforced): wake() before generate(); sleep() before training
(frees the KV cache and, at level 1, moves the weights to CPU); sync_weights(policy) after every
policy update, which wakes the weights if needed, loads them in buckets, wakes the KV cache, resets
the prefix cache and VERIFIES the sync:
  1. checksum: sum and sum of squares (float64) of all engine parameters equal those of the
     trainer's parameters cast to the engine dtype (fused qkv/gate_up do not change sums);
     relative tolerance 1e-6 (summation order differs);
  2. log-probs of a fixed probe sequence (the first prompt ever generated, else fixed ids) from
     vLLM's prompt_logprobs agree with the trainer's within `verify_tol` (mean |diff|).
Either failure raises WeightSyncError and the engine refuses to generate until a good sync.
wake() and sleep() are idempotent, so the trainer's order (wake, generate, sleep, update, sync,
evaluate) works: sync leaves the engine awake.

Sampler log-probs: with logprobs_mode="processed_logprobs" they are log-probs after temperature and
top-p (the distribution actually sampled from); with top_p < 1 that distribution is renormalized
over the nucleus and so differs from a trainer's full-softmax log-prob. The paper samples at
temperature 1, top-p 1. Nothing in this module was run against a real vLLM here (no GPU).
"""
from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_VLLM = ">=0.10.2,<0.12"
_WRAPPER_SEGMENTS = {"module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"}
_FALLBACK_PROBE = [
    785,
    3974,
    13876,
    38835,
    34208,
    916,
    279,
    15678,
    5562,
    13,
    220,
    16,
    10,
    16,
    28,
    17,
]


class WeightSyncError(RuntimeError):
    """The engine's weights do not match the trainer's after a sync."""


# ---------------------------------------------------------------------------- pure helpers
def check_vllm_version(version: str, spec: str = SUPPORTED_VLLM) -> None:
    """ValueError unless `version` is in the supported range."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    if Version(version) not in SpecifierSet(spec):
        raise ValueError(
            f"vLLM {version} is outside the supported range {spec}: the worker-extension / "
            f"sleep-mode API this engine uses was checked for that range only"
        )


def hf_to_vllm_weights(named: Iterable[tuple[str, Any]], tie_word_embeddings: bool,
                       dtype=None) -> Iterator[tuple[str, Any]]:
    """HF (name, tensor) -> the (name, tensor) pairs vLLM's load_weights expects (module
    docstring)."""
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
    """Sleep/wake/sync ordering over a backend with: sleep(level), wake_up(tags), load(named_iter),
    reset_prefix_cache(), checksum(), probe_logprobs(ids), generate(...). See the module
    docstring."""

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
        self, named: Iterable, trainer_checksum: tuple, probe_ids: list, trainer_probe_lp: list
    ) -> dict:
        self.synced_ok = False
        if self.state == "asleep":
            self.backend.wake_up(["weights"])     # weights only: the KV cache is not needed to load
        self.backend.load(named)
        if self.state == "asleep":
            self.backend.wake_up(["kv_cache"])
        self.state = "awake"
        self.backend.reset_prefix_cache()
        engine_sum = self.backend.checksum()
        if not checksums_match(engine_sum, trainer_checksum):
            raise WeightSyncError(
                f"after the weight sync the engine's parameter checksum {engine_sum} differs "
                f"from the trainer's {trainer_checksum}: some weights were not loaded"
            )
        diff = compare_logprobs(
            self.backend.probe_logprobs(probe_ids), trainer_probe_lp, self.verify_tol
        )
        self.synced_ok = True
        self.last_verify = {"sync_logprob_diff": diff, "sync_checksum": engine_sum[0]}
        return self.last_verify


# ---------------------------------------------------------------------------- vLLM side
class RPGWorkerExtension:
    """Mixed into vLLM's GPU worker via LLM(worker_extension_cls=...); called with
    collective_rpc."""

    def rpg_load_weights(self, weights: list) -> int:
        self.model_runner.model.load_weights(weights=weights)
        return len(weights)

    def rpg_checksum(self) -> tuple[float, float]:
        return weights_checksum(p for _, p in self.model_runner.model.named_parameters())


class _VLLMBackend:
    """The thin, untested-here adapter from EngineStateMachine's calls to vLLM's API."""

    def __init__(self, llm, bucket_bytes: int):
        self.llm, self.bucket_bytes = llm, bucket_bytes

    def sleep(self, level):
        self.llm.sleep(level=level)

    def wake_up(self, tags):
        self.llm.wake_up() if tags is None else self.llm.wake_up(tags=tags)

    def load(self, named):
        for chunk in buckets(named, self.bucket_bytes):
            self.llm.collective_rpc("rpg_load_weights", args=(chunk,))

    def reset_prefix_cache(self):
        self.llm.reset_prefix_cache()

    def checksum(self):
        return tuple(self.llm.collective_rpc("rpg_checksum")[0])

    def probe_logprobs(self, ids):
        from vllm import SamplingParams
        out = self.llm.generate([{"prompt_token_ids": list(ids)}],
                                SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0),
                                use_tqdm=False)
        return prompt_logprobs_of(out[0], ids)

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed, eos_id):
        from vllm import SamplingParams
        sp = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                            logprobs=0, seed=seed)
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sp, use_tqdm=False
        )
        return outputs_to_pairs(outs, n, eos_id)


class VLLMEngine:
    """The Engine protocol (rpg_ref.interfaces) on a colocated vLLM (registered as "vllm" in
    rpg_ref.registry.ENGINES)."""

    @dataclass
    class Options:
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
                "help": "vLLM sleep level: 1 offloads weights to CPU and "
                "drops the KV cache; 2 drops both (weights are re-synced anyway)"
            },
        )
        verify_tol: float = field(
            default=0.05,
            metadata={"help": "max mean |log-prob diff| vLLM vs trainer on the probe after a sync"},
        )
        max_model_len: int = field(
            default=0,
            metadata={
                "help": "vLLM context length (0 = longest prompt budget 2048 + max_new_tokens)"
            },
        )
        bucket_mb: int = field(default=512, metadata={"help": "weight-sync chunk size in MiB"})
        enforce_eager: bool = field(default=False, metadata={"help": "disable CUDA graphs"})
        in_process: bool = field(
            default=True,
            metadata={
                "help": "run vLLM's engine core in this process "
                "(VLLM_ENABLE_V1_MULTIPROCESSING=0) so weights pass by reference"
            },
        )

    @classmethod
    def sampler_logprobs_missing(cls, cfg) -> str | None:
        return None  # SamplingParams(logprobs=0): the sampled token's log-prob, always

    def __init__(self, policy, task, cfg, model_path: str | None = None):
        opt = self.Options(**getattr(cfg, "engine_options", {}))
        path = model_path or getattr(getattr(policy, "config", None), "_name_or_path", "")
        self._tmp = None
        if not path or not os.path.isdir(path):  # a policy built in memory: give vLLM a checkpoint
            self._tmp = tempfile.TemporaryDirectory(prefix="rpg-vllm-")
            policy.save_pretrained(self._tmp.name)
            path = self._tmp.name
        tok_path = getattr(task, "tokenizer_path", None) or path
        max_len = opt.max_model_len or 2048 + int(getattr(cfg, "max_new_tokens", 2048))
        self.policy, self.eos_id = policy, getattr(task, "eos_id", None)
        self.tie = bool(getattr(getattr(policy, "config", None), "tie_word_embeddings", False))
        self.seed = int(getattr(cfg, "seed", 0))
        self._calls = 0
        self.probe: list | None = None
        self.llm = self._make_llm(path, tok_path, opt, max_len, self.seed)
        self.sm = EngineStateMachine(_VLLMBackend(self.llm, opt.bucket_mb << 20), opt.sleep_level,
                                     opt.verify_tol)

    @staticmethod
    def _make_llm(path, tok_path, opt, max_len, seed):
        if opt.in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            import vllm
        except ImportError as e:
            raise ValueError(
                "engine 'vllm' needs vLLM (pip install 'rpg-ref[vllm]') and a CUDA GPU"
            ) from e
        check_vllm_version(vllm.__version__)
        return vllm.LLM(model=path, tokenizer=tok_path, dtype="bfloat16", seed=seed,
                        gpu_memory_utilization=opt.gpu_memory_utilization, max_model_len=max_len,
                        enable_sleep_mode=True, enforce_eager=opt.enforce_eager,
                        worker_extension_cls="rpg_ref.engines.vllm.RPGWorkerExtension",
                        logprobs_mode="processed_logprobs")

    @classmethod
    def from_pretrained(cls, path: str, seed: int = 0, **options):
        """An engine on a checkpoint folder without a trainer (used by rpg-eval)."""
        from types import SimpleNamespace

        from transformers import AutoConfig
        policy = SimpleNamespace(config=AutoConfig.from_pretrained(path))
        from transformers import AutoTokenizer
        eos = AutoTokenizer.from_pretrained(path).eos_token_id
        return cls(
            policy,
            SimpleNamespace(eos_id=eos),
            SimpleNamespace(engine_options=options, seed=seed),
            model_path=path,
        )

    # -- the Engine protocol
    def generate_pairs(self, prompts, n, temperature, top_p, max_new_tokens,
                       seed: int | None = None) -> list[tuple[list, list]]:
        """(token ids, sampler log-probs) for n responses per prompt (n consecutive per prompt)."""
        if self.probe is None and prompts:
            self.probe = list(prompts[0])
        self._calls += 1
        seed = self.seed * 1_000_003 + self._calls if seed is None else seed
        return self.sm.generate(prompts, n, temperature, top_p, max_new_tokens, seed, self.eos_id)

    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        """Engine.generate: a Generation (log-probs None when greedy)."""
        from rpg_ref.interfaces import Generation
        pairs = self.generate_pairs(prompts, n, temperature, top_p, max_new_tokens)
        return Generation(
            [p[0] for p in pairs], None if temperature == 0 else [p[1] for p in pairs]
        )

    def sync_weights(self, policy) -> dict:
        import torch
        named = list(hf_to_vllm_weights(policy.named_parameters(), self.tie, torch.bfloat16))
        trainer_sum = weights_checksum(t for _, t in named)
        probe = self.probe or _FALLBACK_PROBE
        with torch.no_grad():
            dev = next(policy.parameters()).device
            ids = torch.tensor([probe], device=dev)                                   # [1, L]
            logits = policy(input_ids=ids).logits.float()                             # [1, L, V]
            lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])   # [L-1, 1]
        return self.sm.sync(iter(named), trainer_sum, probe, lp[:, 0].tolist())

    def sleep(self) -> None:
        self.sm.sleep()

    def wake(self) -> None:
        self.sm.wake()
