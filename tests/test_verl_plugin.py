"""verl plugin: verl's own get_policy_loss_fn(name) returns the rpg_ref loss, rescaled to verl's
aggregation, for every registered name (float64, exact agreement of values and gradients).

Needs verl (its own environment in CI: see docs/verl.md); skipped otherwise.
"""
import os
import subprocess
import sys

import pytest
import torch

verl = pytest.importorskip(
    "verl",
    reason="verl is not installed in this environment: the verl plugin "
    "test runs in its own venv, .venv-verl, which .ci/run creates",
)
from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

from rpg_ref.core.losses import LOSSES
from rpg_ref.integrations import verl as plugin

B, T = 6, 7
AGG = {
    "token-mean": "token-mean",
    "token-sum": "token-mean",
    "seq-mean-token-mean": "seq-mean-token-mean",
    "seq-mean-token-sum": "seq-mean-token-sum",
    "seq-mean-token-sum-norm": "seq-mean-token-sum",
}


def _config(mode, beta=0.05, info=None, use_kl_loss=False):
    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_micro_batch_size_per_gpu=2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        kl_loss_coef=beta,
        use_kl_loss=use_kl_loss,
        loss_agg_mode=mode,
        policy_loss=PolicyLossConfig(loss_mode="vanilla"),
    )
    cfg.global_batch_info.update(info or {})
    return cfg


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05             # [B, T]
    logp = (old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    # verl: [B, T]
    adv = torch.randn(B, generator=g, dtype=torch.float64)[:, None].expand(B, T).contiguous()
    # row 3 is empty
    lengths = torch.tensor([7, 1, 4, 0, 6, 3])
    mask = torch.arange(T)[None, :] < lengths[:, None]                                 # [B, T] bool
    return logp, old, adv, mask


# verl's global batch: this micro-batch is one of dp_size=2 shards of a bigger batch
INFO = {
    "dp_size": 2,
    "batch_num_tokens": 2 * 21 + 5,
    "global_batch_size": 2 * 5 + 1,
    "loss_scale_factor": None,
}


def _expected_scale(mode, mask):
    """verl's agg_loss normalization over rpg_ref's, written out by hand (21 tokens, 5 non-empty
    rows)."""
    n, b, dp = 21.0, 5, 2
    return {"token-mean": n * dp / INFO["batch_num_tokens"], "token-sum": n * dp,
            "seq-mean-token-mean": b * dp / INFO["global_batch_size"],
            "seq-mean-token-sum": b * dp / INFO["global_batch_size"],
            "seq-mean-token-sum-norm": b * dp / INFO["global_batch_size"] / T}[mode]


def test_every_rpg_loss_and_grpo_corrected_is_registered():
    """Every rpg loss with and without clipping; grpo-corrected only clipped (a PPO-type loss always
    clips: a "-noclip" name would silently clip at its default)."""
    names = set(core_algos.POLICY_LOSS_REGISTRY)
    for base in [n for n in LOSSES if n.startswith("rpg-")]:
        assert base in names and f"{base}-noclip" in names
    assert "grpo-corrected" in names and "grpo-corrected-noclip" not in plugin.REGISTERED


def test_clip_ratios_are_checked_by_rpg_ref():
    """verl's clip ratios go through rpg_ref.core.losses.parse_clip: c = inf means no dual bound,
    and a bad ratio is refused with parse_clip's message."""
    assert plugin.read_config(_config("token-mean"), clipped=True) == (0.05, (0.2, 0.28, 10.0))
    cfg = {"kl_loss_coef": 0.05, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    assert plugin.read_config({**cfg, "clip_ratio_c": float("inf")}, clipped=True) == (
        0.05,
        (0.2, 0.28, None),
    )
    assert plugin.read_config({**cfg, "clip_ratio_c": 1.0}, clipped=False) == (0.05, None)
    with pytest.raises(ValueError, match="dual-clip c must be > 1"):
        plugin.read_config({**cfg, "clip_ratio_c": 1.0}, clipped=True)
    with pytest.raises(ValueError, match="clip eps_low must be in"):
        plugin.read_config({**cfg, "clip_ratio_low": 1.0}, clipped=True)


@pytest.mark.parametrize("name", plugin.REGISTERED)
@pytest.mark.parametrize("mode", list(AGG))
def test_verl_registry_returns_rpg_ref_losses(name, mode):
    """get_policy_loss_fn(name) == rpg_ref.core.losses[name] (beta = kl_loss_coef, clip = verl's
    clip ratios, pi_ref = pi_old, token level) times verl's aggregation constant: loss values and
    gradients agree."""
    logp, old, adv, mask = _batch()
    fn = core_algos.get_policy_loss_fn(name)
    x = logp.clone().requires_grad_(True)
    loss, metrics = fn(old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask,
                       loss_agg_mode=mode, config=_config(mode, info=INFO), rollout_is_weights=None)
    loss.backward()
    base = name.removesuffix("-noclip")
    clip = None if name.endswith("-noclip") else (0.2, 0.28, 10.0)
    keep = mask.sum(-1) > 0
    y = logp.clone().requires_grad_(True)
    ref_loss, _ = LOSSES[base](
        y[keep],
        old[keep],
        adv[keep],
        mask[keep].double(),
        beta=0.05,
        clip=clip,
        level="token",
        agg=AGG[mode],
    )
    ref_loss = ref_loss * _expected_scale(mode, mask)
    ref_loss.backward()
    assert loss.dtype == torch.float64
    assert torch.equal(loss.detach(), ref_loss.detach()), (float(loss), float(ref_loss))
    assert torch.equal(x.grad, y.grad)
    assert float(x.grad[3].abs().sum()) == 0.0  # the empty row gets no gradient
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/rpg_kl", "actor/rpg_kl_old"} <= set(metrics)


@pytest.mark.parametrize("mode", list(AGG))
def test_rescaling_matches_verls_own_agg_loss(mode):
    """Independent check of the aggregation constant: with beta = 0 and no clip, rpg-rkl's unit loss
    is -w A per token; verl's agg_loss on that matrix equals the plugin's loss (up to verl's 1e-8
    added to token counts in seq-mean-token-mean: relative 1e-8 / min n_b)."""
    logp, old, adv, mask = _batch(1)
    loss, _ = core_algos.get_policy_loss_fn("rpg-rkl-noclip")(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode=mode,
        config=_config(mode, beta=0.0, info=INFO))
    loss_mat = -torch.exp(logp - old) * adv  # [B, T]
    want = core_algos.agg_loss(
        loss_mat=loss_mat, loss_mask=mask.double(), loss_agg_mode=mode, **INFO
    )
    rtol = 1e-8 if mode == "seq-mean-token-mean" else 1e-13
    assert torch.allclose(loss, want, rtol=rtol, atol=0), (float(loss), float(want))


def test_config_errors_are_clear():
    logp, old, adv, mask = _batch()
    fn = core_algos.get_policy_loss_fn("rpg-reinforce-urkl")
    with pytest.raises(ValueError, match="use_kl_loss"):
        fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
           config=_config("token-mean", use_kl_loss=True))
    with pytest.raises(ValueError, match="rollout_is_weights"):
        fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
           config=_config("token-mean"), rollout_is_weights=torch.ones_like(logp))
    with pytest.raises(ValueError, match="batch_num_tokens"):
        fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
           config=_config("token-mean", info={"dp_size": 2}))
    with pytest.raises(ValueError, match="actor config"):
        fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, config=None)


def test_verl_imports_the_plugin_from_the_environment_variable():
    """What verl's workers do: VERL_USE_EXTERNAL_MODULES makes `import verl` register the losses."""
    code = (
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R; "
        "print(sum(n in R for n in ['rpg-reinforce-urkl', 'rpg-fkl-noclip', 'grpo-corrected']))"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="rpg_ref.integrations.verl")
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "3"


def test_example_launch_script_composes_with_verls_config_schema():
    """Every override in examples/verl/qwen3_4b_rpg_reinforce_urkl.sh is a valid key of this verl's
    ppo_trainer config (Hydra rejects unknown keys), and the RPG settings land where the plugin
    reads them."""
    import re
    import shlex
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    script = (
        Path(__file__).resolve().parent.parent
        / "examples"
        / "verl"
        / "qwen3_4b_rpg_reinforce_urkl.sh"
    )
    text = script.read_text()
    body = text[text.index("python3 -m verl.trainer.main_ppo"):].split('"$@"')[0]
    body = body.replace("$(( (MAX_PROMPT + MAX_RESPONSE) * 4 ))", str((1024 + 2048) * 4))
    for k, v in {"MODEL": "Qwen/Qwen3-4B", "TRAIN_FILE": "t.parquet", "VAL_FILE": "v.parquet",
                 "MAX_PROMPT": "1024", "MAX_RESPONSE": "2048", "OVERLONG_BUFFER": "512"}.items():
        body = body.replace(f"${{{k}}}", v).replace("$" + k, v)
    assert "$" not in body, body
    overrides = shlex.split(body.replace("\\\n", " "))[3:]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"),
                               version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    actor = cfg.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "rpg-reinforce-urkl" and actor.use_kl_loss is False
    assert (
        actor.kl_loss_coef,
        actor.clip_ratio_low,
        actor.clip_ratio_high,
        actor.clip_ratio_c,
    ) == (1e-4, 0.2, 0.28, 10.0)
    assert cfg.algorithm.norm_adv_by_std_in_grpo is False and cfg.actor_rollout_ref.rollout.n == 16
    assert re.search(r"VERL_USE_EXTERNAL_MODULES=rpg_ref\.integrations\.verl", text)
