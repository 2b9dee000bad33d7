"""The ``hf`` engine: batched sampling from a Hugging Face causal LM in the trainer's process.

  weights   Samples from the policy module itself, or, when the policy keeps fp32 master weights
            and computes under bf16 autocast (--math-dtype bf16-autocast), from a bf16 copy of its
            weights (--hf-gen-dtype): a bf16 matrix product reads half the bytes, and autocast
            would re-cast every weight at every decode step. The copy follows the vLLM engine's
            contract: ``sleep()`` frees it before the update, ``sync_weights(policy)`` rebuilds it
            from the updated weights and checks that every tensor equals the policy's cast to bf16
            (WeightSyncError otherwise); sampling from a copy that was not re-synced is refused.
  KV cache  compiled (on CUDA by default, --hf-compile): transformers' StaticCache, key/value
            buffers of a fixed length, so every decode step has the same shapes, and the step
            compiled with torch.compile (mode "reduce-overhead": CUDA graphs); the prompt pass
            runs eagerly. Not compiled: the call's own cache, attended up to its filled slots
            only, under inference mode: with the sdpa kernel a StaticCache of prompt + new
            tokens slots, each attention call reading a view of the filled ones (nothing is
            copied or grown); with the eager kernel a DynamicCache (concatenated every step).
  batching  --hf-chunk sequences per call: auto (on CUDA as many as free memory holds, else all),
            0 (all) or a number. Compiled, every call of a rollout has that batch size (the last
            one is padded with copies of a prompt whose samples are dropped) and reuses one
            StaticCache: one shape and one set of cache addresses, so the step is neither
            recompiled nor its CUDA graph re-recorded from call to call.
  stopping  a call ends as soon as every sequence has emitted EOS.
  sampling  rpg_ref.engines.sample.sample_next (temperature, top-p), and the sampler's log-prob of
            each sampled token, log softmax(logits / temperature), which the trainer compares
            with its own recomputation (logprob_diff_max).

The decode loop passes its own 4D attention mask (which cache slots each query sees), so left
padding, the static cache and the compiled step need nothing from transformers' mask helpers;
it therefore supports the "sdpa" and "eager" attention kernels. Not compiled, the sdpa kernel
runs as ``filled_slots_sdpa`` (registered with transformers' AttentionInterface and set on the
model's config for the call only): transformers' sdpa attention on the slots the mask covers,
a decode step's one query attending with grouped key/value heads as transformers >= 5.24 does
itself. Before 5.24, transformers given a 4D mask copies every key/value head once per query
head (repeat_kv), which in a decode step is a copy of the whole cache (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from rpg_ref.engines.errors import WeightSyncError
from rpg_ref.engines.sample import sample_next
from rpg_ref.interfaces import Generation, cut_at_eos, left_pad

GEN_DTYPES = ("auto", "policy", "bfloat16")
COMPILE = ("auto", "on", "off")
CACHE_LEN_STEP = 256  # compiled: cache lengths rounded up to this, so few shapes get compiled
FREE_MEMORY_SHARE = 0.8  # --hf-chunk auto: the share of free GPU memory the rollout may take


def parse_chunk(value) -> int | None:
    """--hf-chunk: None for 'auto', else sequences per call (0 = all). Old configs hold ints."""
    if value == "auto":
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 0 or isinstance(value, float):
        raise ValueError(f"bad configuration: --hf-chunk must be 'auto', 0 (all sequences) or a "
                         f"number of sequences per generation call, got {value!r}")
    return n


# ---------------------------------------------------------------------------- memory arithmetic
def kv_bytes_per_token(config, dtype_bytes: int = 2) -> int:
    """Key + value cache bytes of one token in every layer of a decoder config."""
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * config.num_key_value_heads * hd * dtype_bytes


def bytes_per_sequence(config, prompt_len: int, cache_len: int, dtype_bytes: int = 2) -> int:
    """GPU memory one sequence of a generation call needs: its KV cache (cache_len tokens), its
    share of the prompt pass (one layer's activations at a time: hidden, q/k/v and 3 MLP
    tensors per prompt token, and the boolean attention mask, prompt_len x cache_len) and of a
    sampling step (~7 fp32 vocabulary rows: logits, log-softmax, probabilities, and the sorted
    values and int64 indices of top-p)."""
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * hd
    prompt = (
        prompt_len * (4 * config.hidden_size + qkv + 3 * config.intermediate_size) * dtype_bytes
    )
    mask = prompt_len * cache_len
    return (kv_bytes_per_token(config, dtype_bytes) * cache_len + prompt + mask
            + 7 * 4 * config.vocab_size)


def sequences_that_fit(free_bytes: int, per_sequence: int, n: int) -> int:
    """Sequences per call for --hf-chunk auto: FREE_MEMORY_SHARE of the free memory, rounded down
    to a power of two (the same few batch shapes from step to step), at least 1, at most n."""
    fit = int(FREE_MEMORY_SHARE * free_bytes // max(1, per_sequence))
    power_of_two = 1 << (fit.bit_length() - 1) if fit >= 1 else 1
    return max(1, min(n, power_of_two))


def bf16_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters are bf16 (no gradients) and whose buffers are the
    model's own (rotary frequencies stay fp32); tied parameters stay tied."""
    memo = {id(p): nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=False)
            for p in model.parameters()}
    memo.update({id(b): b for b in model.buffers()})
    return copy.deepcopy(model, memo).eval()


# ---------------------------------------------------------------------------- the decode loop
def attention_mask(allowed: Tensor, kernel: str, dtype: torch.dtype) -> Tensor:
    """[B, 1, Q, L] bool (True = query may see key slot) in the form the attention kernel adds or
    selects with: sdpa takes booleans, eager adds 0 / the dtype's most negative number."""
    if kernel == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)


@functools.cache
def cache_api(model_class: type) -> tuple[str, bool]:
    """How a model class's forward takes the KV cache, read once from its signature: the
    argument's name ("cache" from transformers 5.24, which deprecates "past_key_values"; the
    old name before) and whether it takes the slots to write (cache_position: transformers < 5)."""
    params = inspect.signature(model_class.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "cache_position" in params


FILLED_SLOTS_SDPA = "rpg-ref-filled-slots-sdpa"  # its name in transformers' AttentionInterface


def filled_slots_sdpa(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor,
                      dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' sdpa attention on the cache slots the mask covers ([B, 1, Q, S]: the first S
    of the cache's, a view). One query (a decode step): its H query heads attend as
    [B, H / R, R, d] against the H / R key/value heads ([B, H / R, S, d]), the mask broadcast
    over R, what transformers >= 5.24 computes itself, bit for bit (transformers'
    ``pack_gqa``); earlier versions repeat every key/value head R times first."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    S = attention_mask.shape[-1]
    key, value = key[:, :, :S], value[:, :, :S]  # [B, H / R, S, d]
    B, H, Q, d = query.shape  # [B, H, Q, d]
    R = getattr(module, "num_key_value_groups", 1)
    if Q > 1 or R == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(B, H // R, R, d), key, value, attn_mask=attention_mask, dropout_p=dropout,
        scale=scaling)  # [B, H / R, R, d]
    return out.reshape(B, H, Q, d).transpose(1, 2).contiguous(), None  # [B, Q, H, d]


@contextlib.contextmanager
def attention_on_filled_slots(config):
    """The model of ``config`` attends with filled_slots_sdpa until the block ends."""
    from transformers import AttentionInterface

    AttentionInterface.register(FILLED_SLOTS_SDPA, filled_slots_sdpa)
    kernel, config._attn_implementation = config._attn_implementation, FILLED_SLOTS_SDPA
    try:
        yield
    finally:
        config._attn_implementation = kernel


def own_cache(config, kernel: str, slots: int):
    """An uncompiled call's own KV cache: with the sdpa kernel a StaticCache of ``slots`` slots
    (filled_slots_sdpa reads its filled ones), with the eager kernel a DynamicCache."""
    from transformers import DynamicCache, StaticCache

    return StaticCache(config=config, max_cache_len=slots) if kernel == "sdpa" else DynamicCache()


def _fp32_or_wider(logits: Tensor) -> Tensor:
    """A copy (a compiled step's output buffer is overwritten by the next step) in fp32, or
    fp64 for a fp64 model."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)


def decode(model, step, prompts: list, pad_id: int, eos_id: int | None, temperature: float,
           top_p: float, max_new_tokens: int, cache=None, cache_len: int = 0):
    """Sample up to max_new_tokens after each prompt: (tokens [B, T], sampler log-probs [B, T]),
    pad after EOS. ``model`` runs the prompt pass, ``step`` (the same module, maybe compiled) the
    one-token decode steps. Prompts are left-padded to P; the t-th new token goes to cache slot
    P + t. ``cache``: a StaticCache of cache_len >= P + max_new_tokens slots for this batch size
    (emptied first, so one can serve call after call), every slot of which every decode step
    attends to (masked), so that every step has the same shapes (what a compiled step needs).
    None: the call's own cache of P + max_new_tokens slots, attended up to the filled ones
    (module docstring)."""
    kernel = model.config._attn_implementation
    own = cache is None
    with (torch.inference_mode() if own else torch.no_grad(),
          attention_on_filled_slots(model.config) if own and kernel == "sdpa"
          else contextlib.nullcontext()):
        return _decode(model, step, prompts, pad_id, eos_id, temperature, top_p, max_new_tokens,
                       cache, cache_len, kernel)


def _decode(model, step, prompts, pad_id, eos_id, temperature, top_p, max_new_tokens, cache,
            cache_len, kernel):
    """decode's loop, under its grad mode and attention function."""
    dev = next(model.parameters()).device
    ids, am = left_pad(prompts, pad_id, dev)  # [B, P]
    B, P = ids.shape
    fixed = cache is not None
    L = cache_len if fixed else P + max_new_tokens  # cache slots
    config = model.config
    dtype = next(model.parameters()).dtype
    if fixed:  # slots >= P + t are masked anyway; reset also rewinds the write position
        if cache_len < P + max_new_tokens:
            raise ValueError(f"a StaticCache of cache_len={cache_len} slots; these prompts need "
                             f"{P + max_new_tokens}")
        cache.reset()
    else:
        cache = own_cache(config, kernel, L)
    cache_arg, old_api = cache_api(type(getattr(model, "module", model)))  # HFPolicy: its module

    def slots_kw(start: int, n: int) -> dict:  # transformers < 5 tell the cache where to write
        return {"cache_position": torch.arange(start, start + n, device=dev)} if old_api else {}

    def keys(n_filled: int) -> int:  # key slots an attention call sees
        return L if fixed else n_filled

    # prompt pass: query q sees slot k <= q holding a prompt token, and itself (so that a padding
    # query sees something: a row of -inf would give NaN keys/values that later leak as 0 * NaN)
    seen = torch.zeros(B, L, dtype=torch.bool, device=dev)  # slots that hold a real token
    seen[:, :P] = am.bool()
    q, k = torch.arange(P, device=dev)[:, None], torch.arange(keys(P), device=dev)[None, :]
    allowed = ((k <= q) & seen[:, None, : keys(P)]) | (k == q)  # [B, P, keys]
    pos = (am.cumsum(-1) - 1).clamp(min=0)  # [B, P]
    out = model(input_ids=ids, attention_mask=attention_mask(allowed[:, None], kernel, dtype),
                position_ids=pos, use_cache=True, logits_to_keep=1, **{cache_arg: cache},
                **slots_kw(0, P))
    logits = _fp32_or_wider(out.logits[:, -1])  # [B, V]
    del out
    last = pos[:, -1:]  # [B, 1] position of the last prompt token

    def next_logits(tok: Tensor, t: int) -> Tensor:  # the t-th new token [B] into slot P + t
        seen[:, P + t] = True
        mask = attention_mask(seen[:, None, None, : keys(P + t + 1)], kernel, dtype)
        out = step(input_ids=tok[:, None], position_ids=last + (t + 1), attention_mask=mask,
                   use_cache=True, logits_to_keep=1, **{cache_arg: cache}, **slots_kw(P + t, 1))
        return _fp32_or_wider(out.logits[:, -1])

    return sample_loop(logits, next_logits, pad_id, eos_id, temperature, top_p, max_new_tokens)


def sample_loop(logits: Tensor, next_logits, pad_id: int, eos_id: int | None, temperature: float,
                top_p: float, max_new_tokens: int) -> tuple[Tensor, Tensor]:
    """Sampling and stopping, whatever computes the logits: (tokens [B, T], sampler log-probs
    [B, T]). ``logits`` [B, V] follow the prompts, ``next_logits(tok, t)`` the t-th sampled
    tokens. A sequence that has emitted eos_id gets pad_id after it; the loop ends after
    max_new_tokens tokens or as soon as every sequence has emitted eos_id."""
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    toks, lps = [], []
    for t in range(max_new_tokens):
        tok, lp = sample_next(logits, temperature, top_p)  # [B], [B]
        if eos_id is not None:
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            done |= tok == eos_id
        toks.append(tok)
        lps.append(lp)
        if t + 1 == max_new_tokens or (eos_id is not None and bool(done.all())):
            break
        logits = next_logits(tok, t)
    return torch.stack(toks, 1), torch.stack(lps, 1)


# ---------------------------------------------------------------------------- the engine
class HFEngine:
    """The Engine protocol (rpg_ref.interfaces) on a Hugging Face causal LM (module docstring)."""

    @dataclass
    class Options:
        chunk: str = field(default="auto", metadata={
            "help": "sequences per generation call: 'auto' (as many as free GPU memory holds; all "
                    "on CPU), 0 (all) or a number"})
        sampler_logprobs: bool = field(default=True, metadata={
            "help": "record the sampler's log-probs to compare with the recomputed ones"})
        gen_dtype: str = field(
            default="auto",
            metadata={
                "help": "weights to sample from: 'auto' (a bf16 copy when the policy computes "
                        "under bf16 "
                "autocast, else the policy itself), 'policy', or 'bfloat16' (always a bf16 "
                "copy, refreshed after every update)"
            },
        )
        compile: str = field(default="auto", metadata={
            "help": "compile the decode step with CUDA graphs: 'auto' (on CUDA), 'on' or 'off'"})

        def __post_init__(self):
            parse_chunk(self.chunk)
            for name, value, valid in (("gen-dtype", self.gen_dtype, GEN_DTYPES),
                                       ("compile", self.compile, COMPILE)):
                if value not in valid:
                    raise ValueError(f"bad configuration: --hf-{name} must be one of {valid}, "
                                     f"got {value!r}")

    @classmethod
    def sampler_logprobs_missing(cls, cfg) -> str | None:
        on = cls.Options(**cfg.engine_options).sampler_logprobs
        return None if on else "--no-hf-sampler-logprobs turns them off; drop it"

    @staticmethod
    def check_available() -> None:
        """ValueError (one line: the install command) when transformers is missing."""
        import importlib.util
        if importlib.util.find_spec("transformers") is None:
            raise ValueError("engine 'hf' needs transformers: pip install 'rpg-ref[llm]'")

    def __init__(self, policy, task, cfg):
        self.opt = o = self.Options(**cfg.engine_options)
        self.policy, self.task = policy, task
        self.model = getattr(policy, "module", policy)  # the HF model inside a wrapper
        autocast = bool(getattr(policy, "autocast", False))
        want_copy = o.gen_dtype == "bfloat16" or (o.gen_dtype == "auto" and autocast)
        self.copy = bf16_copy(self.model) if want_copy else None
        self.stale = False  # the copy was freed by sleep() and not yet rebuilt by sync_weights()
        sampler = self.copy if self.copy is not None else policy
        kernel = sampler.config._attn_implementation
        if kernel not in ("sdpa", "eager"):
            raise ValueError(f"bad configuration: the hf engine samples with the sdpa or eager "
                             f"attention kernel, the model uses {kernel!r} (use --hf-gen-dtype "
                             f"bfloat16 to sample from a copy, or another attention kernel)")
        device = next(sampler.parameters()).device
        self.compiled = o.compile == "on" or (o.compile == "auto" and device.type == "cuda")
        if self.compiled and not hasattr(sampler, "get_compiled_call"):  # e.g. HFPolicy
            if o.compile == "on":
                raise ValueError(
                    "bad configuration: --hf-compile on needs a bf16 copy (--hf-gen-dtype "
                    "bfloat16) or a plain Hugging Face policy to compile"
                )
            self.compiled = False
        self._max_cache_len = 0

    # -- weights: the bf16 copy's life cycle
    def sleep(self):
        """Free the bf16 copy for the update (it is rebuilt by sync_weights)."""
        if self.copy is not None and not self.stale:
            for p in self.copy.parameters():
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            self.stale = True

    def wake(self):
        if self.stale:
            raise WeightSyncError(
                "the hf engine's bf16 copy of the weights was freed for the "
                "update and not refreshed: call engine.sync_weights(policy) after "
                "every policy update, before sampling again"
            )

    def sync_weights(self, policy) -> None:
        """Copy the policy's weights into the bf16 copy and check that every tensor arrived."""
        if self.copy is None:
            return
        model = getattr(policy, "module", policy)
        pairs = list(zip(self.copy.named_parameters(), model.named_parameters()))
        with torch.no_grad():
            for (name, dst), (src_name, src) in pairs:
                if name != src_name:
                    raise WeightSyncError(
                        f"bf16 copy's {name} does not match the policy's {src_name}"
                    )
                if self.stale:  # freed by sleep()
                    dst.data = torch.empty(src.shape, dtype=dst.dtype, device=src.device)
                dst.copy_(src)
            bad = [
                name for (name, dst), (_, src) in pairs if not torch.equal(dst, src.to(dst.dtype))
            ]
        if bad or len(pairs) != len(list(model.parameters())):
            raise WeightSyncError(f"after the weight sync the bf16 copy differs from the policy in "
                                  f"{bad or 'the number of tensors'}")
        self.stale = False

    # -- sampling
    def _chunk_size(self, sampler, n: int, prompt_len: int, cache_len: int) -> int:
        size = parse_chunk(self.opt.chunk)
        if size is not None:
            return size or n
        device = next(sampler.parameters()).device
        if device.type != "cuda":
            return n
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        dtype_bytes = next(sampler.parameters()).element_size()
        return sequences_that_fit(free, bytes_per_sequence(sampler.config, prompt_len, cache_len,
                                                           dtype_bytes), n)

    @torch.no_grad()
    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        self.wake()
        sampler = self.copy if self.copy is not None else self.policy
        flat = [p for p in prompts for _ in range(n)]
        P = max(map(len, flat))
        cache_len = P + max_new_tokens
        step = sampler
        if self.compiled:  # few shapes: lengths rounded up, never shrinking (as transformers does)
            cache_len = -(-cache_len // CACHE_LEN_STEP) * CACHE_LEN_STEP
            cache_len = self._max_cache_len = max(cache_len, self._max_cache_len)
            step = _compiled_step(sampler)
        size = self._chunk_size(sampler, len(flat), P, cache_len)
        record = temperature > 0 and self.opt.sampler_logprobs
        responses, logprobs = [], [] if record else None
        was_training = self.policy.training
        self.policy.eval()
        cache = None
        if self.compiled:  # one StaticCache for every call of this rollout (module docstring)
            from transformers import StaticCache

            cache = StaticCache(config=sampler.config, max_cache_len=cache_len)
        for s in range(0, len(flat), size):
            chunk = flat[s : s + size]
            real = len(chunk)
            if self.compiled:  # one batch shape per rollout: pad, and drop the padding's samples
                chunk = chunk + [chunk[0]] * (size - real)
            toks, lps = decode(
                sampler,
                step,
                chunk,
                self.task.pad_id,
                self.task.eos_id,
                temperature,
                top_p,
                max_new_tokens,
                cache=cache,
                cache_len=cache_len,
            )
            for row, lp in zip(toks[:real].tolist(), lps[:real].tolist()):
                r = cut_at_eos(row, self.task.eos_id)
                responses.append(r)
                if record:
                    logprobs.append(lp[: len(r)])
        self.policy.train(was_training)
        return Generation(responses, logprobs)


def _compiled_step(model):
    """The HF model's forward compiled as transformers compiles its decode steps (CompileConfig
    defaults: inductor, mode "reduce-overhead", i.e. CUDA graphs), marking each call a new step."""
    compiled = model.get_compiled_call(None)

    def step(**inputs):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(**inputs)

    return step
