"""What a plug-in imports: the data that flows through the trainer and the two protocols.

    Prompt      one prompt: token ids + whatever the task's verifier needs
    Generation  what an engine returns: responses (token ids) and, optionally, the sampler's
                log-probs
    Batch       a scored rollout batch as padded tensors (built by ``collate``)
    Task        where prompts, rewards and evaluation come from     (rpg_ref/tasks/)
    Engine      who samples responses                               (rpg_ref/engines/)

A new task or engine is a class that follows its protocol, registered by name in
``rpg_ref.registry`` (TASKS / ENGINES). Nothing here imports the trainer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn


@dataclass
class Prompt:
    ids: list  # prompt token ids
    answer: Any  # whatever the task's verifier needs


@dataclass
class Generation:
    responses: list  # N lists of token ids (EOS included when emitted)
    # the sampler's own log-probs of those tokens, when it reports them
    logprobs: list | None = None


@dataclass
class Batch:
    """A scored rollout batch; tensors have N = prompts * group_size rows, groups consecutive."""

    input_ids: Tensor  # [N, P+T] left-padded prompt, right-padded response
    attention_mask: Tensor  # [N, P+T]
    position_ids: Tensor  # [N, P+T]
    mask: Tensor  # [N, T] float, 1 on response tokens
    rewards: Tensor  # [N]
    correct: Tensor  # [N] bool
    sampler_logp: Tensor | None = None  # [N, T] the engine's own log-probs, when reported
    old_logp: Tensor | None = None  # [N, T] log pi_old: the only copy of pi_old
    ref_logp: Tensor | None = None  # [N, T] log pi_ref (--ref init only)
    adv: Tensor | None = None  # [N] or [N, T]
    # [N, T] or [N] pi_old / pi_sampler (rpg_ref.trainer.rollout_correction)
    rollout_weight: Tensor | None = None

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.mask.shape[1]

    def __len__(self):
        return self.input_ids.shape[0]

    def index(self, idx) -> Batch:
        """Rows ``idx`` (an index tensor or a slice) of every tensor field."""
        return Batch(
            **{
                f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[idx])
                for f in dataclasses.fields(self)
            }
        )

    def trimmed(self) -> Batch:
        """The same rows without the columns that are padding in every row: prompt columns left of
        the longest prompt, response columns right of the longest response. Position ids are
        kept, so every real token is computed exactly as before."""
        P, T = self.prompt_len, max(1, int(self.mask.sum(1).max()))
        P_real = int(self.attention_mask[:, :P].sum(1).max())
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("input_ids", "attention_mask", "position_ids"):  # [N, P+T]
                v = v[:, P - P_real : P + T]
            elif v is not None and v.dim() == 2:  # [N, T]: mask, log-probs, per-token advantages
                v = v[:, :T]
            out[f.name] = v
        return Batch(**out)


def left_pad(prompts: list, pad_id: int, device) -> tuple[Tensor, Tensor]:
    """Token lists -> (ids, attention mask), both [B, P], padded on the left (as HF generate)."""
    P = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in prompts], dtype=torch.long)
    am = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    return ids.to(device), am.to(device)


def cut_at_eos(row: list, eos_id: int | None) -> list:
    """Response tokens up to and including the first EOS."""
    if eos_id is not None and eos_id in row:
        return row[: row.index(eos_id) + 1]
    return row


def collate(prompts: list, responses: list, pad_id: int, device, sampler_lp: list | None) -> dict:
    """Token lists -> padded tensors: prompts left-padded to P, responses right-padded to T.
    Returns the Batch fields that depend only on the tokens (keyword names = Batch fields)."""
    ids_p, am_p = left_pad(prompts, pad_id, device)  # [N, P]
    T = max(1, max(map(len, responses)))
    ids_r = torch.tensor([list(r) + [pad_id] * (T - len(r)) for r in responses], dtype=torch.long)
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (T - len(r)) for r in responses])  # [N, T]
    slp = (None if sampler_lp is None
           else torch.tensor([list(x) + [0.0] * (T - len(x)) for x in sampler_lp]))  # [N, T]
    ids = torch.cat([ids_p, ids_r.to(device)], 1)  # [N, P+T]
    am = torch.cat([am_p, mask.long().to(device)], 1)  # [N, P+T]
    pos = (am.cumsum(-1) - 1).clamp(min=0)  # [N, P+T] as HF generate
    return dict(input_ids=ids, attention_mask=am, position_ids=pos, mask=mask.to(device),
                sampler_logp=None if slp is None else slp.to(device))


def init_seed(cfg) -> int:
    """The seed of a run's initialization: the model's random init and a task's warm start
    (--init-seed; --seed when it is not given). Prompts, sampling and shuffling follow --seed."""
    seed = getattr(cfg, "init_seed", None)
    return cfg.seed if seed is None else seed


def task_progress(total: int, desc: str, enabled: bool):
    """A tqdm bar for a task's own long phase (e.g. the seq task's warm start), or None (no tqdm,
    or progress disabled: then one line says what is running)."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        print(f"{desc}: {total} steps ...", flush=True)
        return None
    return tqdm(total=total, desc=desc, dynamic_ncols=True, leave=False)


class Task(Protocol):
    """Where prompts, rewards and evaluation come from.

    A task may declare an ``Options`` dataclass: each field becomes the flag ``--<task>-<field>``
    and arrives as ``cfg.task_options``.
    """

    name: str
    default_engine: str
    eos_id: int | None  # None: responses always run to max_new_tokens (bandit)
    pad_id: int
    # what ``evaluate`` measures, as the run's last line names it: "held-out" (problems never
    # trained on: the gold measure) or "exact" (computed from the policy, nothing sampled)
    evaluation: str

    def __init__(self, cfg, device: torch.device): ...
    def build_policy(self) -> nn.Module:
        """The trainable policy: module(input_ids, attention_mask, position_ids,
        logits_to_keep).logits.

        Optional, for speed: a plain Hugging Face causal LM, or a wrapper with ``lm_parts()``
        (rpg_ref.models.logprobs), gets its log-probs with the LM head applied in chunks; a wrapper
        that exposes the HF model as ``.module`` and computes under bf16 autocast (``.autocast``) is
        sampled by the hf engine from a bf16 copy of its weights."""

    def sample_prompts(self, n: int, gen: torch.Generator) -> list[Prompt]:
        """n prompts drawn with ``gen`` (the trainer's prompt stream: resume replays it)."""

    def reward(self, prompts: list[Prompt], responses: list[list[int]]) -> tuple[Tensor, Tensor]:
        """(rewards [N] float, correct [N] bool) for responses (token ids, EOS included)."""

    def evaluate(self, policy: nn.Module, engine: Engine) -> dict:
        """Evaluation metrics, logged as eval_<key>."""

    def summary(self, policy: nn.Module, cfg) -> dict:
        """Task-specific entries merged into summary.json; writes nothing."""

    def finish(self, policy: nn.Module, out: Path) -> None:
        """Optional (the loop calls it when the task has it): once, after the last step and before
        summary.json is written, the task's own artifacts under ``out`` (the math task's Hugging
        Face export) and the release of what it holds (the math task's answer-checker workers).
        Under torchrun every rank calls it; ``policy`` is rank 0's full copy, None on the others."""


class Engine(Protocol):
    """Who samples. ``generate`` returns n consecutive responses per prompt (the group layout).

    temperature 0 means greedy. ``sync_weights(policy)`` is called after every policy update
    (a no-op for engines that share the policy module); ``sleep``/``wake`` free and restore the
    engine's memory around the update (no-ops for HF; vLLM's sleep mode). An engine may declare
    an ``Options`` dataclass (flags ``--<engine>-<field>``, ``cfg.engine_options``).
    ``sampler_logprobs_missing(cfg)`` (a classmethod) says why the engine would return no
    Generation.logprobs under cfg, or None when it returns them (needed by --rollout-correction;
    an engine without it is taken to return none). ``check_available()`` (an optional
    staticmethod) raises ValueError when the engine cannot run here (a missing package): the
    trainer calls it before the task builds anything.
    """

    def __init__(self, policy: nn.Module, task: Task, cfg): ...
    def generate(self, prompts: list, n: int, temperature: float, top_p: float,
                 max_new_tokens: int) -> Generation: ...
    def sync_weights(self, policy: nn.Module) -> None: ...
    def sleep(self) -> None: ...
    def wake(self) -> None: ...


class InProcessEngine:
    """Base of engines that sample with the policy module itself: there are no weights to sync
    and no separate memory to release, so the Engine hooks do nothing."""

    def sync_weights(self, policy):
        pass

    def sleep(self):
        pass

    def wake(self):
        pass
