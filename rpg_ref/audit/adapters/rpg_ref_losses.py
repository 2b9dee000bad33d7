"""rpg-ref's own losses (rpg_ref.core.losses) as audit adapters: the 8 rpg losses at level token and
sequence, grpo, grpo-corrected, dapo and reinforce++ (k1 in the reward, return-to-go)."""

from __future__ import annotations

from rpg_ref.audit.adapter import BETA, Adapter
from rpg_ref.audit.adapters.common import AGG
from rpg_ref.core.advantages import kl_return_to_go
from rpg_ref.core.losses import LOSSES, SPECS

RPG = [n for n in LOSSES if SPECS[n].family in ("rpg", "rpg-reinforce")]


def _rpg_ref(name: str, level: str = "token", beta: float = BETA, note: str = "") -> Adapter:
    fn = LOSSES[name]

    def loss(logp, old, ref, adv, mask):
        return fn(logp, old, adv, mask, beta=beta, ref_logp=ref, level=level, agg=AGG)[0]
    return Adapter(name, loss, BETA, "rpg-ref", True, level, note)


def _reinforce_pp() -> Adapter:
    fn = LOSSES["reinforce++"]

    def loss(logp, old, ref, adv, mask):
        # R - beta k1, return to go
        a_tok = kl_return_to_go(adv, mask, old, ref, BETA)
        return fn(logp, old, a_tok, mask, beta=0.0, agg=AGG)[0]
    return Adapter(
        "reinforce++",
        loss,
        BETA,
        "rpg-ref",
        True,
        "token",
        "KL in the reward; also stands for reinforce++-baseline (the group baseline and the "
        "batch whitening couple responses: left out)",
    )


def rpg_ref_adapters() -> list[Adapter]:
    out = [_rpg_ref(n, level) for level in ("token", "sequence") for n in RPG]
    out += [_rpg_ref("grpo"), _rpg_ref("grpo-corrected"),
            _rpg_ref("dapo", beta=0.0, note="no KL term (beta must be 0)"), _reinforce_pp()]
    return out
