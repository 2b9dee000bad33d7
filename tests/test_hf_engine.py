"""rpg_ref/engines/hf.py: the fast HF engine samples from the policy's distribution (chi-square
tests), reports the log-probs the trainer recomputes, stops when every sequence has ended, and
keeps its bf16 copy of the weights equal to the policy's after every update."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rpg_ref import cli
from rpg_ref.engines.hf import (
    HFEngine,
    WeightSyncError,
    bytes_per_sequence,
    cache_api,
    decode,
    filled_slots_sdpa,
    kv_bytes_per_token,
    parse_chunk,
    sequences_that_fit,
)
from rpg_ref.interfaces import Batch, collate
from rpg_ref.models.logprobs import token_logprobs
from rpg_ref.models.policy import HFPolicy
from rpg_ref.trainer import train

EOS, PAD = 14, 15


def tiny_qwen3(seed: int = 0, sharpen: float = 1.0, dtype=torch.float64):
    """A 2-layer Qwen3 over 16 tokens (4 query heads, 2 key/value heads); ``sharpen`` scales the
    LM head so that next-token distributions are far from uniform (a test of temperature needs
    something to sharpen)."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        tie_word_embeddings=False, attn_implementation="sdpa", eos_token_id=EOS, pad_token_id=PAD)
    model = transformers.Qwen3ForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model


def engine(policy, eos=EOS, **options):
    task = SimpleNamespace(eos_id=eos, pad_id=PAD)
    return HFEngine(policy, task, SimpleNamespace(engine_options=options))


def recomputed(policy, prompts, responses):
    b = Batch(**collate(prompts, responses, PAD, "cpu", None), rewards=torch.zeros(len(prompts)),
              correct=torch.zeros(len(prompts), dtype=torch.bool))
    with torch.no_grad():
        return token_logprobs(policy, b, 1.0), b.mask


# ------------------------------------------------------------------------------------------
# what is sampled
# ------------------------------------------------------------------------------------------


def test_sampler_logprobs_equal_the_policy_recomputation():
    """float64: the engine's log-prob of every sampled token (prompt pass + decode steps against
    the static KV cache, left-padded prompts of different lengths) equals the trainer's one-pass
    recomputation (rpg_ref.models.logprobs) to 1e-10, for responses cut at EOS."""
    policy = tiny_qwen3(sharpen=3.0)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]]
    torch.manual_seed(0)
    g = engine(policy).generate(prompts, 3, 1.0, 1.0, 8)
    flat = [p for p in prompts for _ in range(3)]
    lp, mask = recomputed(policy, flat, g.responses)
    slp = torch.tensor(
        [x + [0.0] * (mask.shape[1] - len(x)) for x in g.logprobs], dtype=torch.float64
    )
    assert ((lp - slp) * mask).abs().max() < 1e-10
    assert any(r[-1] == EOS for r in g.responses) and all(EOS not in r[:-1] for r in g.responses)


def test_static_cache_decodes_what_the_eager_path_decodes():
    """float64: the static KV cache of the compiled path (fixed-length key buffers, 64 slots, most
    of them masked) and the eager path's own cache, attended up to its filled slots, give the
    same tokens from the same seed and log-probs equal to 1e-12, with left-padded prompts of
    different lengths."""
    from transformers import StaticCache

    policy = tiny_qwen3(sharpen=3.0)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]] * 2
    out = {}
    for static in (False, True):
        torch.manual_seed(0)
        cache = StaticCache(config=policy.config, max_cache_len=64) if static else None
        out[static] = decode(
            policy, policy, prompts, PAD, EOS, 1.0, 1.0, 8, cache=cache, cache_len=64
        )
    assert torch.equal(out[True][0], out[False][0])
    assert (out[True][1] - out[False][1]).abs().max() < 1e-12


def reference_attention(query, key, value, mask, scale):
    """softmax(q k^T * scale, masked) v, written out: every query head h reads key/value head
    h // R (R = query heads per key/value head). [B, H, Q, d] -> [B, Q, H, d]."""
    R = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(R, 1), value.repeat_interleave(R, 1)  # [B, H, S, d]
    scores = (query @ k.transpose(-1, -2) * scale).masked_fill(~mask, -math.inf)
    return (scores.softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("R", [1, 2, 4])
@pytest.mark.parametrize("Q", [1, 3])
def test_filled_slots_attention_reads_the_slots_the_mask_covers(Q, R):
    """float64: filled_slots_sdpa, given key/value buffers of 12 slots and a mask over the first
    7, equals attention written out over those 7 (random mask, every query seeing its last slot)
    to 1e-12, for one query (a decode step: grouped heads) and three, with 1, 2 and 4 query heads
    per key/value head. From transformers 5.24, which groups a single query's heads itself, it
    is transformers' sdpa attention on the 7 slots bit for bit."""
    from packaging.version import Version
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(Q * 10 + R)
    B, KV, d, S = 3, 2, 8, 7
    q = torch.randn(B, KV * R, Q, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, KV, 12, d, generator=g, dtype=torch.float64) for _ in "kv")
    mask = torch.rand(B, 1, Q, S, generator=g) < 0.6
    mask[..., -1] = True
    module = SimpleNamespace(num_key_value_groups=R, is_causal=True, training=False)
    out, _ = filled_slots_sdpa(module, q, k, v, mask, scaling=d**-0.5)
    assert out.shape == (B, Q, KV * R, d)
    want = reference_attention(q, k[:, :, :S], v[:, :, :S], mask, d**-0.5)
    assert (out - want).abs().max() < 1e-12
    if Version(transformers.__version__).release >= (5, 24):
        own, _ = sdpa_attention_forward(module, q, k[:, :, :S], v[:, :, :S], mask,
                                        scaling=d**-0.5)
        assert torch.equal(out, own)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eager_decoding_is_transformers_own_sdpa_decoding(dtype, monkeypatch):
    """The uncompiled decode (its own attention, a static cache read up to its filled slots)
    against the same decode through transformers' sdpa attention and a DynamicCache, from the same
    seed, left-padded prompts, EOS: the same tokens, and from transformers 5.24 (which groups a
    single query's heads itself) the same log-probs bit for bit, float32 included; before 5.24
    (which repeats the heads) equal to 1e-12 in float64."""
    from packaging.version import Version
    from transformers import DynamicCache

    from rpg_ref.engines import hf

    policy = tiny_qwen3(sharpen=3.0, dtype=dtype)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]] * 2
    out = []
    for own in (True, False):
        if not own:  # transformers' attention and a growing cache
            monkeypatch.setattr(hf, "attention_on_filled_slots", lambda c: contextlib.nullcontext())
            monkeypatch.setattr(hf, "own_cache", lambda *a: DynamicCache())
        torch.manual_seed(0)
        out.append(decode(policy, policy, prompts, PAD, EOS, 1.0, 1.0, 10))
    assert torch.equal(out[0][0], out[1][0]) and (out[0][0] == EOS).any()
    if Version(transformers.__version__).release >= (5, 24):
        assert torch.equal(out[0][1], out[1][1])
    elif dtype == torch.float64:
        assert (out[0][1] - out[1][1]).abs().max() < 1e-12


def test_decode_steps_copy_no_key_value_heads_and_restore_the_kernel(monkeypatch):
    """Uncompiled, with 2 query heads per key/value head, transformers repeats the key/value heads
    (repeat_kv) for the prompt pass only (2 layers x keys and values), never in the 7 decode steps
    (which transformers < 5.24 did at every step given a mask); the model's attention kernel is
    "sdpa" again after the call, and after a call that fails."""
    from transformers.integrations import sdpa_attention

    calls = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: calls.append(n) or real(x, n))
    policy = tiny_qwen3()
    torch.manual_seed(0)
    toks, _ = decode(policy, policy, [[1, 2, 3], [4, 5]], PAD, None, 1.0, 1.0, 8)
    assert toks.shape == (2, 8) and calls == [2] * 4
    assert policy.config._attn_implementation == "sdpa"

    def failing_step(**kwargs):
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        decode(policy, failing_step, [[1, 2, 3]], PAD, None, 1.0, 1.0, 8)
    assert policy.config._attn_implementation == "sdpa"


def test_cache_argument_name_is_read_from_the_forward_signature():
    """transformers 5.24 renames the forward's ``past_key_values`` to ``cache`` (the old name warns
    until its removal in 5.40); 5.23 has only the old name; transformers < 5 also take
    ``cache_position``. The name comes from the signature, whichever version is installed."""

    class New:
        def forward(self, input_ids, cache=None, use_cache=None): ...

    class Old:
        def forward(self, input_ids, past_key_values=None, cache_position=None): ...

    assert cache_api(New) == ("cache", False)
    assert cache_api(Old) == ("past_key_values", True)
    from packaging.version import Version

    renamed = Version(transformers.__version__).release >= (5, 24)
    expected = "cache" if renamed else "past_key_values"
    assert cache_api(transformers.Qwen3ForCausalLM)[0] == expected


def test_hfpolicy_turns_the_cache_off_only_when_no_cache_is_given():
    """HFPolicy's single forward passes use_cache=False (no KV cache allocated) unless the caller
    gives a cache, under either name."""

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))  # HFPolicy reads its device

        def forward(self, **kwargs):
            return kwargs

    policy = HFPolicy(Recorder())
    assert policy(input_ids=1)["use_cache"] is False
    for name in ("cache", "past_key_values"):
        assert "use_cache" not in policy(input_ids=1, **{name: object()})


@pytest.mark.parametrize("static", [False, True])
def test_decoding_raises_no_deprecation_warning_and_hfpolicy_keeps_the_cache(static):
    """Decoding through the installed transformers (the plain model and the HFPolicy wrapper, the
    dynamic and the static cache) emits no FutureWarning, and the wrapper passes the cache on
    with use_cache (a wrapper that dropped it would decode every step without the prompt's keys:
    other tokens, so equal outputs show the cache reached the model)."""
    import warnings

    from transformers import StaticCache

    model = tiny_qwen3(sharpen=3.0)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]]
    out = []
    for sampler in (model, HFPolicy(model)):
        cache = StaticCache(config=model.config, max_cache_len=32) if static else None
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            out.append(decode(sampler, sampler, prompts, PAD, EOS, 1.0, 1.0, 8, cache=cache,
                              cache_len=32))
    assert torch.equal(out[0][0], out[1][0])
    assert (out[0][1] - out[1][1]).abs().max() < 1e-12


def test_generation_stops_when_every_sequence_has_ended():
    """With EOS the most likely token by far, every response is [EOS] and the engine runs the
    prompt pass only: no decode step is run for 63 more tokens of padding."""
    policy = tiny_qwen3()
    head = torch.nn.Linear(32, 16, bias=True, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(policy.lm_head.weight)
        head.bias.zero_()
        head.bias[EOS] = 100.0
    policy.lm_head = head
    calls = []
    hook = policy.register_forward_pre_hook(lambda *a: calls.append(1))
    torch.manual_seed(0)
    g = engine(policy).generate([[1, 2], [3]], 4, 1.0, 1.0, 64)
    hook.remove()
    assert g.responses == [[EOS]] * 8 and len(calls) == 1


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts against probabilities; tokens expected fewer than 5
    times are pooled into one cell. The p-value is the chi-square survival function,
    Q(df / 2, X^2 / 2) (regularized upper incomplete gamma)."""
    n = counts.sum()
    expected = n * probs
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(exp) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def nucleus(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p distribution, written out: visit tokens from the most probable; keep a token
    while the probability mass of the tokens kept before it is below top_p; renormalize."""
    keep, mass = torch.zeros_like(p), 0.0
    for i in sorted(range(len(p)), key=lambda i: -float(p[i])):
        if mass >= top_p:
            break
        keep[i], mass = 1.0, mass + float(p[i])
    return p * keep / (p * keep).sum()


ALPHA = 1e-4  # false-failure rate of each chi-square check below (6 checks: <= 6e-4 per run)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8), (1.5, 0.95)])
def test_samples_follow_the_policy_distribution(temperature, top_p):
    """20,000 two-token samples after one prompt (fixed seed). The first token's counts fit the
    policy's softmax(logits / temperature) restricted to the top-p nucleus, and the second
    token's counts after the most frequent first token fit the distribution computed from the
    policy's forward pass on prompt + that token (the decode step against the KV cache), by
    Pearson's chi-square test at level ALPHA; tokens outside the nucleus never appear. The test
    has power: the same counts are rejected (p < 1e-6) against the untempered, uncut distribution
    whenever temperature or top_p differ from 1."""
    policy, prompt, n = tiny_qwen3(seed=1, sharpen=4.0), [1, 2, 3, 4], 20_000
    torch.manual_seed(0)
    g = engine(policy, eos=None).generate([prompt], n, temperature, top_p, 2)
    toks = torch.tensor(g.responses)  # [n, 2]
    with torch.no_grad():
        first_logits = policy(input_ids=torch.tensor([prompt])).logits[0, -1]
        c1 = torch.bincount(toks[:, 0], minlength=16).double()
        a = int(c1.argmax())
        second_logits = policy(input_ids=torch.tensor([prompt + [a]])).logits[0, -1]
        c2 = torch.bincount(toks[toks[:, 0] == a, 1], minlength=16).double()
    for counts, logits in ((c1, first_logits), (c2, second_logits)):
        target = nucleus(torch.softmax(logits / temperature, -1), top_p)
        assert torch.equal(counts[target == 0], torch.zeros_like(counts[target == 0]))
        assert chi_square_p_value(counts, target) > ALPHA
        if (temperature, top_p) != (1.0, 1.0):
            assert chi_square_p_value(counts, torch.softmax(logits, -1)) < 1e-6


def test_compiled_decode_step_samples_what_the_eager_one_samples():
    """--hf-compile on (torch.compile of the decode step; CUDA graphs on a GPU, inductor's CPU
    code here) gives the same tokens as the eager step from the same seed, and log-probs equal to
    float32 rounding, on a second call too (the compiled step is reused). Two float32 log-probs
    z_y - logsumexp(z) from different kernels differ by up to about 2 eps32 sqrt(H) S, S the
    largest |z| + |logsumexp z| (tests/test_vllm_real.py derives it): 4.2e-6 here; measured over
    policy seeds 0-5, at most 4.8e-7."""
    policy = tiny_qwen3(dtype=torch.float32)
    prompts, out = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], {}
    for mode in ("off", "on"):
        e = engine(policy, eos=None, compile=mode)
        assert e.compiled == (mode == "on")
        for _ in range(2):
            torch.manual_seed(1)
            out[mode] = e.generate(prompts, 2, 1.0, 1.0, 6)
    assert out["on"].responses == out["off"].responses
    diff = max(
        abs(a - b) for x, y in zip(out["on"].logprobs, out["off"].logprobs) for a, b in zip(x, y)
    )
    scale = 0.0
    for i, r in enumerate(out["off"].responses):
        p = prompts[i // 2]
        with torch.no_grad():
            z = policy(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1]   # [T, V]
        scale = max(scale, float((z.abs().amax(-1) + torch.logsumexp(z, -1).abs()).max()))
    bound = 2 * torch.finfo(torch.float32).eps * math.sqrt(policy.config.hidden_size) * scale
    assert diff <= bound, (diff, bound)


def test_a_reused_static_cache_decodes_what_a_fresh_one_decodes():
    """float64: a StaticCache that already decoded one batch, emptied and reused for a second batch
    of other prompts (other lengths), gives the second batch the tokens and log-probs a fresh cache
    gives it from the same seed (nothing of the first batch leaks); a reused cache too short for
    the prompts is refused."""
    from transformers import StaticCache

    policy = tiny_qwen3()
    first, second = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [[9], [3, 3, 3, 3, 3], [2, 7]]
    torch.manual_seed(3)
    fresh = decode(policy, policy, second, PAD, EOS, 1.0, 1.0, 8,
                   cache=StaticCache(config=policy.config, max_cache_len=32), cache_len=32)
    cache = StaticCache(config=policy.config, max_cache_len=32)
    decode(policy, policy, first, PAD, EOS, 1.0, 1.0, 8, cache_len=32, cache=cache)
    torch.manual_seed(3)
    reused = decode(policy, policy, second, PAD, EOS, 1.0, 1.0, 8, cache_len=32, cache=cache)
    assert torch.equal(reused[0], fresh[0])
    assert torch.allclose(reused[1], fresh[1], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="cache_len=8 slots; these prompts need 13"):  # 5 + 8
        decode(policy, policy, second, PAD, EOS, 1.0, 1.0, 8, cache_len=8, cache=cache)


def test_compiled_rollout_calls_have_one_batch_shape_and_one_cache(monkeypatch):
    """--hf-compile on, --hf-chunk 2, 5 sequences: three decode calls, the last padded to 2
    sequences, all with the same StaticCache object, so the decode step is compiled once (one
    dynamo graph: a batch of 1 would compile a second) and, on a GPU, its CUDA graph recorded
    once; the padding's samples are dropped (5 responses come back)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from rpg_ref.engines import hf

    calls = []
    real_decode = hf.decode

    def recording_decode(model, step, prompts, *args, cache=None, **kw):
        calls.append((len(prompts), cache))
        return real_decode(model, step, prompts, *args, cache=cache, **kw)

    monkeypatch.setattr(hf, "decode", recording_decode)
    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]
    e = engine(tiny_qwen3(dtype=torch.float32), eos=None, compile="on", chunk="2")
    out = e.generate([[1, 2, 3], [4, 5], [6, 7, 8, 9], [2], [5, 5]], 1, 1.0, 1.0, 4)
    assert [len(r) for r in out.responses] == [4] * 5 and len(out.logprobs) == 5
    assert [b for b, _ in calls] == [2, 2, 2]
    assert calls[0][1] is not None and all(c is calls[0][1] for _, c in calls)
    assert counters["stats"]["unique_graphs"] - graphs_before == 1


# ------------------------------------------------------------------------------------------
# the bf16 copy of the weights
# ------------------------------------------------------------------------------------------


def test_bf16_copy_is_rebuilt_by_sync_and_refused_when_stale():
    """A policy with fp32 master weights under bf16 autocast samples from a bf16 copy (buffers
    shared, fp32 rotary frequencies kept). sleep() frees it; after a simulated update, sampling
    without sync_weights raises WeightSyncError; sync_weights rebuilds it equal to the updated
    policy's weights cast to bf16, and sampling works again."""
    from rpg_ref.models.policy import HFPolicy

    policy = HFPolicy(tiny_qwen3(dtype=torch.float32), "bf16-autocast").eval()
    e = engine(policy)
    assert all(p.dtype == torch.bfloat16 for p in e.copy.parameters())
    assert all(b.dtype == torch.float32 for b in e.copy.buffers())
    e.generate([[1, 2, 3]], 2, 1.0, 1.0, 4)
    e.sleep()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with pytest.raises(WeightSyncError, match="sync_weights"):
        e.generate([[1, 2, 3]], 2, 1.0, 1.0, 4)
    e.sync_weights(policy)
    for (name, c), (_, p) in zip(e.copy.named_parameters(), policy.module.named_parameters()):
        assert torch.equal(c, p.detach().bfloat16()), name
    assert len(e.generate([[1, 2, 3]], 2, 1.0, 1.0, 4).responses) == 2


def _seq_argv(out: Path, *extra) -> list:
    return ["--task", "seq", "--steps", "3", "--prompts-per-step", "4", "--group-size", "4",
            "--mini-batch-size", "8", "--seq-eval-size", "8", "--eval-every", "1", "--lr", "0.01",
            "--weight-decay", "1.0",  # moves every weight by 1% per update (random policy: A = 0)
            "--seq-warm-steps", "0", "--hf-gen-dtype", "bfloat16", "--out", str(out),
            "--no-progress", *extra]


def test_trainer_refreshes_the_bf16_copy_after_every_update(tmp_path, monkeypatch):
    """rpg-train (seq task, --hf-gen-dtype bfloat16, AdamW weight decay 1.0 at lr 0.01, so every
    update moves every weight by 1%, across bf16 grid points): at every generation (rollouts and
    evaluations of 3 steps) the engine's bf16 copy equals the current policy's weights cast to
    bf16, and it changes from rollout to rollout. The sampler really is the bf16 copy: the logged
    logprob_diff_max (sampler vs fp32 recomputation) is of bf16 rounding size, above 1e-4 (an
    fp32 sampler differs by < 1e-5 here) and below 0.05 (bf16's epsilon is 2^-8 = 3.9e-3; measured
    over seeds 0-9, 3 steps each: 3.1e-3 to 6.5e-3, so both bounds are 7x or more away). With
    sync_weights skipped, the run stops with WeightSyncError instead of sampling from stale
    weights."""
    seen = []
    generate = HFEngine.generate

    def checked(self, *args, **kwargs):
        seen.append(max(float((c.float() - p.detach().bfloat16().float()).abs().max())
                        for c, p in zip(self.copy.parameters(), self.model.parameters())))
        seen.append([c.detach().clone() for c in self.copy.parameters()])
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", checked)
    train.train(cli.parse_config(_seq_argv(tmp_path / "a")))
    diffs, copies = seen[0::2], seen[1::2]
    # the evaluation of the initial policy before step 1, then 3 x (a rollout, an evaluation)
    assert len(diffs) == 7 and max(diffs) == 0.0
    rollouts = copies[1::2]
    for before, after in itertools.pairwise(rollouts):
        assert any(not torch.equal(x, y) for x, y in zip(before, after)), "the copy never moved"
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert all(1e-4 < r["logprob_diff_max"] < 0.05 for r in rows), rows

    monkeypatch.setattr(HFEngine, "generate", generate)
    monkeypatch.setattr(HFEngine, "sync_weights", lambda self, policy: None)
    with pytest.raises(WeightSyncError, match="sync_weights"):
        train.train(cli.parse_config(_seq_argv(tmp_path / "b")))


# ------------------------------------------------------------------------------------------
# options and memory arithmetic
# ------------------------------------------------------------------------------------------


def test_chunk_option_accepts_auto_and_counts_and_old_integer_configs(tmp_path):
    """--hf-chunk is 'auto' (the default), 0 (all) or a count; a config.json written when the
    option was an int still loads; anything else is refused before any work."""
    assert (parse_chunk("auto"), parse_chunk("0"), parse_chunk("12"), parse_chunk(32)) == (
        None,
        0,
        12,
        32,
    )
    for bad in ("-1", "some", 1.5, None):
        with pytest.raises(ValueError, match="--hf-chunk must be"):
            parse_chunk(bad)
    cfg = cli.parse_config(["--hf-chunk", "7", "--out", str(tmp_path / "a")])
    assert (
        cfg.engine_options["chunk"] == "7" and HFEngine.Options(**cfg.engine_options).chunk == "7"
    )
    assert HFEngine.Options(chunk=32).chunk == 32
    for flags, msg in ((["--hf-chunk", "lots"], "--hf-chunk must be"),
                       (["--hf-gen-dtype", "fp8"], "--hf-gen-dtype must be one of"),
                       (["--hf-compile", "maybe"], "--hf-compile must be one of")):
        with pytest.raises(ValueError, match=msg):
            cli.parse_config([*flags, "--out", str(tmp_path / "b")])
    assert not (tmp_path / "b").exists()


def test_a_missing_transformers_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """Without transformers (an install without the llm extra), rpg-train on a task sampled by
    the hf engine stops with the install command in one line, exit 2, and writes nothing."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    out = tmp_path / "run"
    assert cli.main(["--task", "seq", "--engine", "hf", "--steps", "1", "--out", str(out),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == "rpg-train: engine 'hf' needs transformers: pip install 'rpg-ref[llm]'\n"
    assert not out.exists()


def test_memory_arithmetic_by_hand():
    """Qwen3-4B's shape: KV 36 layers x (K, V) x 8 heads x 128 x 2 bytes = 147,456 B per token;
    one sequence with a 1,000-token prompt and a 3,000-slot cache: 147,456 x 3,000 KV + 1,000 x
    (4 x 2560 + (32 + 16) x 128 + 3 x 9728) x 2 prompt-pass + 1,000 x 3,000 mask + 7 x 4 x 151,936
    sampling bytes.
    --hf-chunk auto keeps 80% of free memory, rounded down to a power of two, within [1, n]."""
    c = SimpleNamespace(num_hidden_layers=36, num_key_value_heads=8, num_attention_heads=32,
                        head_dim=128, hidden_size=2560, intermediate_size=9728, vocab_size=151936)
    assert kv_bytes_per_token(c) == 147_456
    want = 147_456 * 3000 + 1000 * (4 * 2560 + 48 * 128 + 3 * 9728) * 2 + 3_000_000 + 28 * 151_936
    assert bytes_per_sequence(c, 1000, 3000) == want
    assert sequences_that_fit(100 * 2**30, 2**30, 512) == 64  # 80 fit -> 64
    assert sequences_that_fit(100 * 2**30, 2**30, 50) == 50
    assert sequences_that_fit(2**20, 2**30, 512) == 1
    assert math.isclose(bytes_per_sequence(c, 0, 1) - 28 * 151_936, 147_456)
