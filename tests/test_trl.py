"""rpg_ref.integrations.trl: the rpg losses inside TRL's GRPOTrainer.

On one batch the trainer's loss and gradient equal rpg_ref's own (rpg_ref.models.logprobs +
rpg_ref.core.losses, float64); TRL settings that contradict a loss are refused when the config is
built; a 2-process torchrun run of the example script trains, in sync, on 2 processes."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOConfig

from rpg_ref.core.losses import LOSSES
from rpg_ref.integrations.trl import SUPPORTED, RPGConfig, RPGTrainer
from rpg_ref.interfaces import Batch
from rpg_ref.models.logprobs import token_logprobs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trl" / "train_rpg_qwen3.py"
_spec = importlib.util.spec_from_file_location("train_rpg_qwen3", EXAMPLE)
example = sys.modules["train_rpg_qwen3"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

B, P, T, TEMPERATURE = 4, 4, 6, 0.7
LENGTHS = [6, 3, 1, 5]  # response tokens per row (right padding after)


def _batch(vocab: int, seed: int = 0, lengths=LENGTHS):
    """TRL's inputs for one batch: no left padding (TRL passes no position ids, so both paths must
    see positions 0..P+T-1), ragged responses, and noise that each test adds to the current
    log-probs for old and reference ones (see _inputs), so that ratios straddle every clip bound."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(2, vocab, (B, P), generator=g)
    completion = torch.randint(2, vocab, (B, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()  # [B, T]
    completion = completion * mask                                          # pad id 0
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    noise = torch.randn(2, B, T, generator=g, dtype=torch.float64) * 0.4
    return prompt, completion, mask, adv, noise


def _rpg_ref_logp(model, prompt, completion, mask):
    ids = torch.cat([prompt, completion], 1)
    attn = torch.cat([torch.ones_like(prompt), mask], 1)
    b = Batch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=torch.arange(P + T).expand(B, -1),
        mask=mask.to(torch.float64),
        rewards=torch.zeros(B),
        correct=torch.zeros(B, dtype=torch.bool),
    )
    return token_logprobs(model, b, TEMPERATURE)                                # [B, T]


def _inputs(prompt, completion, mask, adv, old) -> dict:
    """TRL's inputs dict for compute_loss: the batch and its old log-probs."""
    return {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }


class Float64LogProbs(RPGTrainer):
    """RPGTrainer whose log-probs are rpg_ref's (float64): TRL's own fused LM head always computes
    in float32, so for an exact comparison both paths must read the same log-probs; that TRL's
    agree with rpg_ref's to float32 rounding is test_trl_logprobs_match_rpg_ref."""

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           **kwargs):
        assert input_ids.shape == (B, P + T) and logits_to_keep == T
        logp = _rpg_ref_logp(model, input_ids[:, :P], input_ids[:, P:], attention_mask[:, P:])
        return logp, None, None


def _trainer(tmp_path, cls=RPGTrainer, config=RPGConfig, **opts):
    """A float64 tiny Qwen3, loaded by TRL from a folder (so that with rpg_reference='model' TRL
    loads its reference model from there too); TRL's CPU default bf16 autocast off."""
    tok = example.toy_tokenizer()
    if not (tmp_path / "model").is_dir():
        example.tiny_model(tok).double().save_pretrained(tmp_path / "model")
    args = config(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                  per_device_train_batch_size=B, num_generations=2, max_completion_length=T,
                  temperature=TEMPERATURE, model_init_kwargs={"dtype": "auto"}, **opts)
    return cls(model=str(tmp_path / "model"), reward_funcs=example.toy_reward, args=args,
               train_dataset=example.toy_data(8), processing_class=tok)


def test_trl_logprobs_match_rpg_ref(tmp_path):
    """TRL's log-probs of a batch (its fused LM head, at the sampling temperature) equal
    rpg_ref.models.logprobs.token_logprobs' on the response tokens up to float32 rounding (TRL's
    head computes in float32): the two paths score the same tokens at the same positions."""
    trainer = _trainer(tmp_path)
    prompt, completion, mask, _, _ = _batch(trainer.model.config.vocab_size)
    with torch.no_grad():
        ids = torch.cat([prompt, completion], 1)
        attn = torch.cat([torch.ones_like(prompt), mask], 1)
        trl, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, T)
        ref = _rpg_ref_logp(trainer.model, prompt, completion, mask)
    assert trl.dtype == torch.float32
    assert float(((trl.double() - ref) * mask).abs().max()) < 1e-5
    assert float((ref * mask).abs().min(1).values.max()) > 0.1  # not trivially 0


# (loss, RPGConfig options, rpg_ref's aggregation, factor TRL's loss_type puts on top)
CASES = [
    ("rpg-fkl", dict(loss_type="grpo", epsilon=0.1, epsilon_high=0.15), "seq-mean-token-mean", 1.0),
    ("rpg-rkl", dict(rpg_level="sequence", rpg_clip=False, loss_type="luspo"),
     "seq-mean-token-sum", 1.0),
    ("rpg-ufkl", dict(loss_type="dr_grpo", rpg_dual_clip_c=3.0), "seq-mean-token-sum", 1.0 / T),
    ("rpg-urkl", dict(rpg_reference="model", beta=1e-2, rpg_beta=1e-2,
                      use_bias_correction_kl=False), "token-mean", 1.0),
    ("rpg-reinforce-fkl", dict(rpg_level="sequence", loss_type="grpo", epsilon_high=0.28),
     "seq-mean-token-mean", 1.0),
    ("rpg-reinforce-rkl", dict(loss_type="bnpo", rpg_dual_clip_c=float("inf")), "token-mean", 1.0),
    ("rpg-reinforce-ufkl", dict(rpg_reference="model", beta=0.05, rpg_beta=0.05, loss_type="luspo",
                                use_bias_correction_kl=False), "seq-mean-token-sum", 1.0),
    ("rpg-reinforce-urkl", dict(rpg_dual_clip_c=3.0), "token-mean", 1.0),
    ("grpo", dict(rpg_reference="model", beta=0.04, rpg_beta=0.04, use_bias_correction_kl=False),
     "token-mean", 1.0),
    ("grpo-corrected", dict(loss_type="grpo", rpg_reference="model", beta=0.03, rpg_beta=0.03),
     "seq-mean-token-mean", 1.0),
    ("dapo", dict(), "token-mean", 1.0),
]


@pytest.mark.parametrize("bias_corrected,loss_type", [(False, "dapo"), (True, "dapo"),
                                                       (True, "grpo")])
def test_trl_kl_flag_means_what_it_means_in_grpo_trainer(tmp_path, bias_corrected, loss_type):
    """TRL's GRPOTrainer with a reference model (beta > 0) and use_bias_correction_kl gives, on one
    batch, the loss and gradient of RPGTrainer with the loss that flag names (False: grpo, k3 as
    TRL adds it; True: grpo-corrected, k3 times pi_theta/pi_old), float64, 1e-12."""
    from trl import GRPOTrainer

    class TRLFloat64(GRPOTrainer):  # Float64LogProbs's log-probs; TRL logs an entropy
        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            logp, _, _ = Float64LogProbs._get_per_token_logps_and_entropies(self, *args, **kwargs)
            return logp, torch.zeros_like(logp), None

    opts = dict(beta=0.04, loss_type=loss_type, use_bias_correction_kl=bias_corrected,
                epsilon_high=0.28)
    trl = _trainer(tmp_path, TRLFloat64, GRPOConfig, **opts)
    rpg = _trainer(tmp_path, Float64LogProbs, rpg_loss="grpo-corrected" if bias_corrected else
                   "grpo", rpg_reference="model", rpg_beta=0.04, **opts)
    prompt, completion, mask, adv, noise = _batch(rpg.model.config.vocab_size)
    with torch.no_grad():
        logp = _rpg_ref_logp(rpg.model, prompt, completion, mask)
    inputs = _inputs(prompt, completion, mask, adv, logp + noise[0] * mask)
    inputs["ref_per_token_logps"] = logp + noise[1] * mask
    results = []
    for trainer in (trl, rpg):
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in trainer.model.parameters()]))
    (loss_trl, grads_trl), (loss_rpg, grads_rpg) = results
    assert abs(loss_trl - loss_rpg) <= 1e-12 * max(1.0, abs(loss_trl)) and abs(loss_trl) > 1e-3
    gmax = max(float(g.abs().max()) for g in grads_trl)
    assert gmax > 0
    for a, b in zip(grads_trl, grads_rpg):
        assert torch.allclose(a, b, rtol=0, atol=1e-12 * max(1.0, gmax))


def test_cases_cover_every_supported_loss():
    """Every loss RPGTrainer accepts is checked for exactness below."""
    assert sorted(c[0] for c in CASES) == sorted(SUPPORTED)
    assert set(SUPPORTED) >= {n for n in LOSSES if n.startswith("rpg-")}


@pytest.mark.parametrize("name,opts,agg,factor", CASES, ids=[c[0] for c in CASES])
def test_trl_loss_and_gradient_equal_rpg_ref(tmp_path, name, opts, agg, factor):
    """RPGTrainer.compute_loss on one batch (TRL's inputs dict) gives rpg_ref's loss
    (rpg_ref.models.logprobs.token_logprobs + LOSSES[name] with the mapped options, aggregation
    `agg`, times the constant of TRL's loss_type) and the same gradient for every parameter,
    float64, 1e-12."""
    torch.manual_seed(0)
    trainer = _trainer(tmp_path, Float64LogProbs, rpg_loss=name, **opts)
    model, a = trainer.model, trainer.args
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop at each step
    prompt, completion, mask, adv, noise = _batch(model.config.vocab_size)
    with torch.no_grad():
        logp = _rpg_ref_logp(model, prompt, completion, mask)
    old, ref = logp + noise[0] * mask, logp + noise[1] * mask
    inputs = _inputs(prompt, completion, mask, adv, old)
    if a.rpg_reference == "model":
        inputs["ref_per_token_logps"] = ref
    model.zero_grad()
    loss_trl = trainer.compute_loss(model, inputs)
    loss_trl.backward()
    grads_trl = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    high = a.epsilon if a.epsilon_high is None else a.epsilon_high  # TRL's reading of None
    clip = None if not a.rpg_clip else (a.epsilon, high, a.rpg_dual_clip_c)
    loss_ref, _ = LOSSES[name](
        _rpg_ref_logp(model, prompt, completion, mask),
        old,
        adv,
        mask,
        beta=a.rpg_beta,
        clip=clip,
        level=a.rpg_level,
        agg=agg,
        ref_logp=ref if a.rpg_reference == "model" else None,
    )
    (loss_ref * factor).backward()
    assert loss_trl.dtype == torch.float64
    assert abs(loss_trl.item() - loss_ref.item() * factor) <= 1e-12 * max(1.0, abs(loss_ref.item()))
    gmax = max(float(p.grad.abs().max()) for p in model.parameters())
    assert gmax > 0
    for p, g in zip(model.parameters(), grads_trl):
        assert torch.allclose(g, p.grad, rtol=0, atol=1e-12 * max(1.0, gmax))


class FakeVLLMGeneration:
    """Stands for TRL's VLLMGeneration (vLLM is not installed here) in colocate mode: one
    completion per prompt, sampled from the policy at ``SAMPLER_TEMPERATURE`` (a sampler that is
    not pi_old) and reported with its log-probs in vLLM's shape [seq][token][top-k], plus
    ``log_noise`` (N(0, log_noise) per token) so that ratios straddle any cap. The first token of
    the first completion has no log-prob (None: vLLM's report of a NaN)."""

    log_noise = 0.0

    def __init__(self, model, processing_class, max_completion_length, **_):
        self.model, self.eos = model, processing_class.eos_token_id
        self.length, self.g = max_completion_length, torch.Generator().manual_seed(0)

    def sync_weights(self):
        pass

    @torch.no_grad()
    def generate(self, prompts, images, num_generations, profiler=None):
        completions, logprobs = [], []
        for prompt in prompts:
            ids, lps = list(prompt), []
            for _ in range(self.length):
                logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
                lp = torch.log_softmax(logits / SAMPLER_TEMPERATURE, -1)
                tok = int(torch.multinomial(lp.exp(), 1, generator=self.g))
                noise = float(torch.randn((), generator=self.g, dtype=torch.float64))
                ids.append(tok)
                lps.append([float(lp[tok]) + self.log_noise * noise])
                if tok == self.eos:
                    break
            if not completions:
                lps[0] = [None]
            completions.append(ids[len(prompt):])
            logprobs.append(lps)
        return prompts, completions, logprobs, None


SAMPLER_TEMPERATURE = 1.3 * TEMPERATURE


def _logp64(model, input_ids, attention_mask, n):
    """Log-probs of the last n tokens at TEMPERATURE, float64 (TRL's computation, TRL's inputs:
    no position ids), for batches of any shape."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.double()
    lp = torch.log_softmax(logits[:, -n - 1:-1] / TEMPERATURE, -1)              # [B, n, V]
    return lp.gather(-1, input_ids[:, -n:, None])[..., 0]                       # [B, n]


class Float64AnyShape(RPGTrainer):
    """RPGTrainer whose log-probs are float64 for TRL's own batches (Float64LogProbs's reason)."""

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           **kwargs):
        return _logp64(model, input_ids, attention_mask, logits_to_keep), None, None


@pytest.fixture
def float64_default():
    """TRL builds the sampler's log-probs with torch.tensor(list): float64 only by default."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _vllm_trainer(tmp_path, monkeypatch, cls=RPGTrainer, log_noise=0.0, **opts):
    """An RPGTrainer built with use_vllm=True (TRL's colocate mode) whose vLLM is
    FakeVLLMGeneration."""
    import trl.trainer.grpo_trainer as grpo

    monkeypatch.setattr(grpo, "VLLMGeneration", FakeVLLMGeneration)
    monkeypatch.setattr(FakeVLLMGeneration, "log_noise", log_noise)
    return _trainer(tmp_path, cls, use_vllm=True, vllm_mode="colocate", **opts)


VLLM_IS = [("sequence_mask", 3.0), ("sequence_truncate", 3.0), ("token_mask", 3.0),
           ("token_truncate", 3.0), ("sequence_mask", None), ("token_mask", 1.5)]


@pytest.mark.parametrize("mode,cap", VLLM_IS, ids=[f"{m}-{c}" for m, c in VLLM_IS])
def test_vllm_correction_weights_are_trls(tmp_path, monkeypatch, float64_default, mode, cap):
    """With use_vllm=True, TRL's vllm_importance_sampling_mode and clip_max become rpg_ref's rollout
    correction with the same weights: RPGTrainer.rollout_weights on TRL's own batch (TRL's
    _generate_and_score_completions, which computes TRL's importance_sampling_ratio from the
    sampler's log-probs) equals TRL's ratio, float64, 1e-12; some weights are capped or masked
    (none without a cap), some are not; a token without a sampler log-prob counts as ratio 1, as
    in TRL. The loss is then rpg_ref's loss with TRL's ratio as sample_weight (1e-12)."""
    trainer = _vllm_trainer(tmp_path, monkeypatch, Float64AnyShape, log_noise=0.8,
                            vllm_importance_sampling_mode=mode,
                            vllm_importance_sampling_clip_max=cap)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [trainer.train_dataset[i // 2] for i in range(B)]       # each prompt num_generations=2
    out = trainer._generate_and_score_completions(rows)
    mask = out["completion_mask"]
    trl_ratio = out["importance_sampling_ratio"]                   # [B, T] or [B, 1]
    assert trl_ratio.dtype == torch.float64 and bool(out["sampling_per_token_logps"][0, 0].isnan())
    weight, _ = trainer.rollout_weights(out, mask)
    sequence = mode.startswith("sequence")
    expected = trl_ratio[:, 0] if sequence else trl_ratio * mask
    assert weight.shape == expected.shape
    assert float((weight - expected).abs().max()) <= 1e-12
    units = expected if sequence else expected[mask.bool()]
    bound = 0.0 if mode.endswith("mask") else cap
    assert bool(((units > 0) & (units != bound)).any())
    assert bool((units == bound).any()) == (cap is not None)

    # the loss takes exactly those weights (advantages of the toy reward are often 0: set some)
    out["advantages"] = torch.randn(B, generator=torch.Generator().manual_seed(2),
                                    dtype=torch.float64)
    n = out["completion_ids"].shape[1]
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attn = torch.cat([out["prompt_mask"], mask], 1)
    loss_trl = trainer.compute_loss(model, out)
    keep = mask.sum(-1) > 0
    loss_ref, _ = LOSSES[trainer.args.rpg_loss](
        _logp64(model, ids, attn, n)[keep], out["old_per_token_logps"][keep],
        out["advantages"][keep], mask[keep], sample_weight=expected[keep],
        options=trainer.rpg_options)
    assert abs(loss_trl.item() - loss_ref.item()) <= 1e-12 * max(1.0, abs(loss_ref.item()))
    assert abs(loss_ref.item()) > 1e-6


def test_trl_with_vllm_trains_with_trls_default_correction(tmp_path, monkeypatch):
    """RPGTrainer with use_vllm=True and TRL's defaults (vllm_importance_sampling_correction on,
    sequence_mask, clip_max 3) trains: TRL samples through its vLLM backend (here
    FakeVLLMGeneration, at a temperature other than the trainer's), the rollout correction's
    statistics are logged at every step and the weights change."""
    trainer = _vllm_trainer(tmp_path, monkeypatch, max_steps=2, logging_steps=1,
                            learning_rate=1e-2, save_strategy="no", rpg_beta=0.01)
    args = trainer.args
    assert (args.vllm_importance_sampling_correction, args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_max) == (True, "sequence_mask", 3.0)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logs = [x for x in trainer.state.log_history if "rpg/rc_weight_mean" in x]
    assert len(logs) == 2
    assert all(0 < x["rpg/rc_weight_mean"] and 0 <= x["rpg/rc_capped_frac"] <= 1 for x in logs)
    assert any(x["rpg/rc_log_ratio_max"] > 0 for x in logs)
    change = sum(float((p.detach() - b).abs().sum()) for p, b in
                 zip(trainer.model.parameters(), before))
    assert change > 0


def _torchrun_example(tmp_path, *extra):
    """The example script on the toy task under torchrun with 2 processes (about 10 s)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(EXAMPLE), "--tiny", "--output_dir", str(tmp_path / "out"), "--max_steps", "2",
           "--per_device_train_batch_size", "4", "--num_generations", "4",
           "--max_completion_length", "6", "--steps_per_generation", "2", "--learning_rate", "1e-3",
           "--rpg_beta", "0.01", "--report_to", "none", "--save_strategy", "no", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)


def test_trl_trains_on_two_processes(tmp_path):
    """`torchrun --nproc_per_node 2` of examples/trl/train_rpg_qwen3.py --tiny --use_cpu trains an
    rpg loss with TRL on 2 processes: each process reports num_processes 2 and a distributed run
    (MULTI_CPU), the ranks are 0 and 1, the weights changed, and both replicas end identical.
    Two optimizer steps per generated batch, so the second update is off-policy (pi_old kept)."""
    run = _torchrun_example(tmp_path, "--use_cpu")
    assert run.returncode == 0, run.stderr[-3000:]
    found = re.findall(r"rank \d+ of \d+ \((\w+)\): (\{[^{}]*\})", run.stdout)
    assert len(found) == 2, run.stdout[-3000:]
    reports = [json.loads(report) for _, report in found]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["num_processes"] == 2 for r in reports)
    assert [kind for kind, _ in found] == ["MULTI_CPU", "MULTI_CPU"]
    assert all(r["weight_change"] > 1e-3 for r in reports)
    assert reports[0]["checksum"] == reports[1]["checksum"]


def test_trl_torchrun_without_use_cpu_is_refused(tmp_path):
    """Under torchrun on CPU without use_cpu=True each process would train alone (accelerate sees
    one process): RPGTrainer stops, before training, with one line naming the fix instead."""
    run = _torchrun_example(tmp_path, "--bf16", "False")  # bf16 on CPU fails in TRL before that
    assert run.returncode != 0
    msg = "error: 2 processes were launched but accelerate sees 1: on CPU set use_cpu=True"
    assert msg in run.stderr
    assert "Traceback" not in run.stderr.split(msg)[0]  # (torchrun's own report follows it)


BAD = [  # (RPGConfig options, what the one-line error says)
    (dict(rpg_loss="reinforce++"), "its KL is in a token-level reward"),
    (dict(rpg_loss="no-such-loss"), "cannot run in TRL; choose one of"),
    (dict(beta=0.04), "with rpg_reference='old' (pi_ref = pi_old, the paper) set beta=0"),
    (dict(rpg_reference="model"), "set beta = rpg_beta (got beta=0.0, rpg_beta=0.0001)"),
    (dict(rpg_reference="init"), "rpg_reference must be one of"),
    (dict(loss_type="cispo"), "loss_type 'cispo' is a loss of its own"),
    (dict(loss_type="sapo"), "loss_type 'sapo' is a loss of its own"),
    (dict(delta=2.0), "delta=2.0 is not supported"),
    (dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold=0.5 is not supported"),
    (dict(top_entropy_quantile=0.2), "top_entropy_quantile=0.2 is not supported"),
    (dict(entropy_coef=0.01), "entropy_coef=0.01 is not supported"),
    (dict(importance_sampling_level="sequence"), "is TRL's geometric mean of token ratios (GSPO)"),
    (dict(rpg_reference="model", beta=1e-4), "use_bias_correction_kl=True weights TRL's k3 term, "
     "which RPGTrainer replaces by rpg-reinforce-urkl's KL: set use_bias_correction_kl=False"),
    (dict(rpg_loss="grpo", rpg_reference="model", beta=1e-4, rpg_beta=1e-4),
     "set rpg_loss='grpo-corrected'"),
    (dict(rpg_loss="grpo-corrected", rpg_reference="model", beta=1e-4, rpg_beta=1e-4,
          use_bias_correction_kl=False), "set rpg_loss='grpo' (k3 as TRL adds it)"),
    (dict(use_vllm=True, vllm_importance_sampling_clip_min=0.5),
     "vllm_importance_sampling_clip_min=0.5 has no counterpart"),
    (dict(use_vllm=True, vllm_importance_sampling_clip_max=0.5),
     "vllm_importance_sampling_clip_max=0.5: rollout correction cap must be a number >= 1"),
    (dict(use_vllm=True, vllm_importance_sampling_mode="token_mask", rpg_level="sequence"),
     "use a sequence_* mode"),
    (dict(use_vllm=True, vllm_importance_sampling_mode="sequence"),
     "vllm_importance_sampling_mode must be one of"),
    (dict(rpg_dual_clip_c=1.0), "dual-clip c must be > 1"),
    (dict(epsilon=1.5), "eps_low must be in (0, 1)"),
    (dict(rpg_beta=-1.0), "beta must be a finite number >= 0"),
    (dict(rpg_loss="dapo", rpg_beta=0.1), "dapo has no KL term"),
    (dict(rpg_loss="grpo", rpg_clip=False), "grpo is a PPO-type loss that always clips"),
]


@pytest.mark.parametrize("opts,message", BAD, ids=[m[:30] for _, m in BAD])
def test_rpg_config_refuses_contradicting_trl_settings(tmp_path, opts, message):
    """A TRL setting that contradicts the rpg loss is refused when RPGConfig is built (before a
    model is loaded), with one line naming the setting and the fix."""
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        RPGConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **opts)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_rpg_config_defaults_and_trl_meanings(tmp_path):
    """Defaults (app:detailed_exp_setup_choices and the released scripts): beta 1e-4, dual-clip
    c = 10, pi_ref = pi_old with no TRL reference model, the advantage R - group mean
    (scale_rewards 'none'), token-mean (loss_type 'dapo'); grpo keeps its own (no dual bound) and
    TRL's std-scaled advantage; dapo has beta 0. TRL's own flags keep TRL's meaning:
    epsilon_high None is epsilon (the paper's clip needs epsilon_high=0.28), and with use_vllm
    TRL's default correction (sequence_mask, clip_max 3) is rpg_ref's mis at level sequence,
    cap 3."""
    from math import inf

    from rpg_ref.integrations.trl import rpg_clip, vllm_correction

    def cfg(**kw):
        return RPGConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
    a = cfg()
    assert (a.rpg_loss, a.rpg_beta, a.beta, a.rpg_reference) == (
        "rpg-reinforce-urkl",
        1e-4,
        0.0,
        "old",
    )
    assert rpg_clip(a) == (0.2, 0.2, 10.0) and a.scale_rewards == "none" and a.loss_type == "dapo"
    assert rpg_clip(cfg(epsilon=0.1)) == (0.1, 0.1, 10.0)
    assert rpg_clip(cfg(epsilon_high=0.28)) == (0.2, 0.28, 10.0)
    g = cfg(rpg_loss="grpo")
    assert rpg_clip(g) == (0.2, 0.2, None) and g.scale_rewards == "group"
    d = cfg(rpg_loss="dapo")
    assert rpg_clip(d) == (0.2, 0.2, None) and d.rpg_beta == 0.0
    assert rpg_clip(cfg(epsilon_high=0.3, rpg_dual_clip_c=float("inf"))) == (0.2, 0.3, None)
    assert vllm_correction(a) is None
    assert vllm_correction(cfg(use_vllm=True)) == ("mis", "sequence", 3.0)
    assert vllm_correction(cfg(use_vllm=True, vllm_importance_sampling_mode="token_mask",
                               vllm_importance_sampling_clip_max=None)) == ("mis", "token", inf)
    assert vllm_correction(cfg(use_vllm=True, vllm_importance_sampling_correction=False)) is None


def test_dapo_normalization_is_the_global_token_mean():
    """loss_type='dapo' (TRL's default): 2 processes x 2 micro-batches, each process's gradient
    the sum over its micro-batches of d(rpg token-mean x trl_scale), averaged over processes as
    DDP does, equals the gradient of rpg_ref's token-mean over the union batch (float64, 1e-12),
    with TRL's default steps_per_generation = gradient_accumulation_steps."""
    from rpg_ref.integrations.trl import trl_scale
    g = torch.Generator().manual_seed(1)
    n, t = 16, 7
    logp = (-torch.rand(n, t, generator=g, dtype=torch.float64) * 3).requires_grad_()
    old = (logp + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64)).detach()
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = (torch.arange(t)[None] < torch.randint(1, t + 1, (n,), generator=g)[:, None]).double()
    opts = dict(beta=0.01, clip=(0.2, 0.28, 3.0))
    fn = LOSSES["rpg-reinforce-urkl"]
    (ref_grad,) = torch.autograd.grad(fn(logp, old, adv, mask, **opts)[0], logp)
    total = torch.zeros_like(logp)
    for rows in torch.arange(n).view(2, 2, -1).reshape(4, -1):     # (process, micro-batch) slices
        loss, _ = fn(logp[rows], old[rows], adv[rows], mask[rows], **opts)
        scale = trl_scale(
            "dapo",
            n_tokens=float(mask[rows].sum()),
            rows_kept=len(rows),
            rows=len(rows),
            num_items_in_batch=mask.sum(),
            num_processes=2,
            accumulation=2,
            steps_per_generation=2,
            max_completion_length=t,
        )
        total += torch.autograd.grad(loss * scale, logp)[0] / 2      # DDP: mean over processes
    assert float(ref_grad.abs().max()) > 0
    assert torch.allclose(total, ref_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_trl_empty_rows_count_as_in_trl(tmp_path, loss_type):
    """A response with no loss token (TRL's mask_truncated_completions) adds nothing and, for
    TRL's per-row means, still counts as a row: the loss is rpg_ref's over the 3 other rows,
    times 3/4 for the row means (grpo, dr_grpo), with dr_grpo's 1/max_completion_length."""
    trainer = _trainer(tmp_path, Float64LogProbs, rpg_loss="rpg-reinforce-rkl", loss_type=loss_type,
                       epsilon_high=0.28)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    prompt, completion, mask, adv, noise = _batch(model.config.vocab_size, lengths=[6, 0, 2, 5])
    with torch.no_grad():
        old = _rpg_ref_logp(model, prompt, completion, mask) + noise[0] * mask
    inputs = _inputs(prompt, completion, mask, adv, old)
    loss_trl = trainer.compute_loss(model, inputs)
    keep = torch.tensor([0, 2, 3])
    agg = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum"}
    factor = {"dapo": 1.0, "grpo": 3 / 4, "dr_grpo": 3 / 4 / T}[loss_type]
    logp = _rpg_ref_logp(model, prompt, completion, mask)
    loss_ref, _ = LOSSES["rpg-reinforce-rkl"](
        logp[keep],
        old[keep],
        adv[keep],
        mask[keep],
        beta=1e-4,
        clip=(0.2, 0.28, 10.0),
        agg=agg[loss_type],
    )
    assert abs(loss_trl.item() - loss_ref.item() * factor) <= 1e-12
    assert abs(loss_ref.item()) > 1e-3


@pytest.mark.parametrize("schedule", [dict(num_iterations=2), dict(steps_per_generation=2)])
def test_trl_iterative_reference_is_the_rollout_policy(tmp_path, schedule):
    """pi_ref = pi_old in TRL's terms: a batch that serves two updates (num_iterations=2, or two
    optimizer steps per generation) is scored at the second update against the policy that
    generated it. Update 1: pi_theta = pi_old exactly (ratio 1, KL(pi_theta || pi_old) = 0);
    update 2: the ratio moved off 1 and the KL to pi_old is positive, so pi_old was held fixed
    while pi_theta changed."""
    tok = example.toy_tokenizer()
    args = RPGConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                     per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
                     learning_rate=1e-2, max_steps=2, logging_steps=1, save_strategy="no",
                     rpg_beta=0.01, **schedule)
    trainer = RPGTrainer(model=example.tiny_model(tok), reward_funcs=example.toy_reward, args=args,
                         train_dataset=example.toy_data(16), processing_class=tok)
    trainer.train()
    logs = [x for x in trainer.state.log_history if "rpg/kl_old" in x]
    assert len(logs) == 2
    assert logs[0]["rpg/kl_old"] < 1e-10
    assert logs[1]["rpg/kl_old"] > 1e-6
