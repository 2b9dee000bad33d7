"""rpg-train's configuration: the ``Config`` dataclass, checked where it is built.

Each field's ``help`` is its --help text (rpg_ref/cli.py hands the dataclass to tyro) and a numeric
field's ``rule`` its range. ``Config.__post_init__`` checks every rule, then each section's
``_check_*`` (written under the section's fields) the rules that tie fields together, and resolves
what is left to the run (the engine, beta, the task's and engine's options): ``Config(...)`` from
Python is the configuration rpg-train would run, and a bad one is one ValueError line naming the
flag. ``from_preset`` applies a named preset (rpg_ref/trainer/presets.py), then the flags given.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple

import torch
import tyro

from rpg_ref.core.advantages import ADVANTAGES, GROUP_ESTIMATORS, TOKEN_LEVEL
from rpg_ref.core.losses import AGGREGATIONS, LEVELS, SPECS, LossOptions, resolve_options
from rpg_ref.registry import ENGINES, TASKS, resolve
from rpg_ref.trainer.presets import DEFAULT_PRESET, PRESETS
from rpg_ref.trainer.rollout_correction import check_options as check_rollout_correction


class Rule(NamedTuple):
    """A field's allowed values (a number's range, a name's choices): ``ok(value)``, and ``words``
    for the message."""
    words: str
    ok: Callable[[Any], bool]


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


DEFAULT_BETA = 1e-3  # the KL coefficient of a loss that has one, unless --beta
AT_LEAST_1 = Rule("an integer >= 1", lambda v: _int(v) and v >= 1)
AT_LEAST_0 = Rule("an integer >= 0", lambda v: _int(v) and v >= 0)
SEED = Rule("an integer in [0, 2^63)", lambda v: _int(v) and 0 <= v < 2**63)
POSITIVE = Rule("finite and > 0", lambda v: _num(v) and 0 < v < math.inf)  # nan: every test fails
NON_NEGATIVE = Rule("finite and >= 0", lambda v: _num(v) and 0 <= v < math.inf)
PROBABILITY = Rule("in (0, 1]", lambda v: _num(v) and 0 < v <= 1)


def one_of(*choices: str) -> Rule:
    return Rule(" or ".join(map(repr, choices)), lambda v: v in choices)


def _f(default, help: str, rule: Rule | None = None):
    """A field with its --help text and, where it has one, its rule."""
    meta = {"help": help, "rule": rule}
    if isinstance(default, (list, dict)):  # mutable: a fresh copy each
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


NoFlag = Annotated[dict, tyro.conf.Suppress]  # a field with no flag of its own


def _bad(msg: str):
    raise ValueError(f"bad configuration: {msg}")


def flag(key: str) -> str:
    """The flag of a field or an option: micro_batch_size -> --micro-batch-size."""
    return "--" + key.replace("_", "-")


@dataclass
class Config:
    # --- run ---
    preset: str | None = _f(None, "named preset of hyperparameters (see PRESETS); explicit flags "
                            "override it. None: the preset named like --task if there is one, "
                            "else 'seq'")
    task: str = _f("seq", f"task: one of rpg_ref.registry.TASKS ({', '.join(TASKS)})")
    out: str | None = _f(None, "output folder (None: runs/<task>-<algo>-s<seed>, plus a hash of "
                         "the flags that change the preset's values)")
    resume: str | None = _f(
        None, "continue the run stored in this output folder (its config is reused)")
    seed: int = _f(0, "random seed (python, numpy, torch): prompts, sampling, shuffling", SEED)
    init_seed: int | None = _f(None, "seed of the initialization: the model's random init and "
                               "the task's warm start (the seq task's supervised phase and its "
                               "cache key, the bandit's initial logits). None: --seed. Runs with "
                               "one --init-seed and different --seed share their initial weights",
                               SEED)
    steps: int = _f(60, "training steps; one step = one rollout batch and its inner optimizer "
                    "loop", AT_LEAST_1)
    device: str = _f("auto", "cpu, cuda, cuda:N or auto (cuda when available)")
    threads: int = _f(0, "torch CPU threads (0 = torch's default; 1 is fastest for tiny models)",
                      AT_LEAST_0)
    dist_timeout: float = _f(1800.0, "under torchrun: seconds a rank waits in a collective "
                             "before the run stops with an error (a hung rank; a dead one stops "
                             "it at once); while the ranks set up, at least 600", POSITIVE)
    cache_dir: str = _f(
        "runs/cache", "cache for task artifacts (e.g. the seq task's warm-started weights)")

    def _check_run(self):
        resolve(TASKS, self.task, "task")
        try:  # the machine's own devices are checked by rpg-train (rpg_ref.cli)
            ok = self.device == "auto" or torch.device(self.device).type in ("cpu", "cuda")
        except RuntimeError:
            ok = False
        if not ok:
            _bad(f"--device {self.device!r} is not cpu, cuda, cuda:N or auto")

    # --- algorithm ---
    algo: str = _f("rpg-reinforce-urkl", "loss: a name in rpg_ref.core.losses.LOSSES")
    beta: float | None = _f(None, "KL coefficient (for reinforce++ it enters the reward); None: "
                            "1e-3, or 0 for a loss with no KL term (dapo)")
    adv: str = _f(
        "auto", "advantage estimator in rpg_ref.core.advantages.ADVANTAGES; auto = the loss's "
        "default")
    clip: list[float] | None = _f(  # noqa: RUF009
        None, "clipping eps_low eps_high [c]: PPO / RPG-Style dual clip (c > 1, 'inf' = no dual "
        "bound). None: the loss's own (none for rpg losses)")
    no_clip: Annotated[bool, tyro.conf.FlagCreatePairsOff] = _f(  # --no-clip only
        False, "no clipping (rpg losses only; PPO-type baselines always clip)")
    level: str = _f("token", f"importance-ratio level: one of {LEVELS}")
    agg: str = _f("token-mean", f"loss aggregation: one of {AGGREGATIONS}")
    ref: str = _f("iterative", "pi_ref: 'iterative' (pi_ref = pi_old, one model) or 'init' "
                  "(frozen initial policy, a second model)", one_of("iterative", "init"))

    def _check_algorithm(self):
        try:  # the loss's own rules: name, beta, clip, level, agg
            opts = loss_options(self)
        except ValueError as e:  # named: --algo and the flags the message speaks of
            named = [f"--{k} {' '.join(map(str, v)) if k == 'clip' else v}"
                     for k, v in (("algo", self.algo), ("beta", self.beta), ("clip", self.clip),
                                  ("level", self.level), ("agg", self.agg))
                     if v is not None and (k == "algo" or k in str(e))]
            _bad(f"{' '.join(named)}{' --no-clip' * self.no_clip}: {e}")
        if self.beta is None:  # the beta loss_options resolved, wherever it goes
            self.beta = opts.beta + opts.reward_beta  # (one of the two is 0)
        self.clip = None if self.clip is None else [float(c) for c in self.clip]  # 'inf' stays inf
        adv = resolved_adv(self)
        if adv not in ADVANTAGES:
            _bad(f"unknown advantage estimator --adv {self.adv!r}; valid: auto, "
                 f"{', '.join(ADVANTAGES)}")
        if (adv in TOKEN_LEVEL) != SPECS[self.algo].kl_in_reward:
            _bad(f"--adv {adv} does not fit --algo {self.algo} (reinforce++ losses need "
                 f"reinforce++ advantages)")
        if self.group_size == 1 and adv in GROUP_ESTIMATORS:
            _bad(f"--group-size 1 with the group baseline {adv!r}: every advantage would be 0; "
                 f"use --group-size >= 2 or --adv batch-mean")

    # --- rollout ---
    engine: str = _f("auto", "sampler: one of rpg_ref.registry.ENGINES; auto = the task's default")
    prompts_per_step: int = _f(16, "prompts per rollout batch", AT_LEAST_1)
    group_size: int = _f(8, "responses per prompt (G)", AT_LEAST_1)
    temperature: float = _f(1.0, "sampling temperature (log-probs are computed at the same "
                            "temperature)", POSITIVE)
    top_p: float = _f(1.0, "nucleus sampling threshold in (0, 1]", PROBABILITY)
    max_new_tokens: int = _f(8, "maximum response length in tokens", AT_LEAST_1)
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: drop groups whose rewards are all "
                                "equal and sample more prompts to refill the batch")
    dynamic_sampling_rounds: int = _f(8, "cap on generation rounds per step for dynamic sampling; "
                                      "when hit, the batch is completed with dropped groups "
                                      "(dyn_filled=0)", AT_LEAST_1)
    overlong_buffer: int = _f(0, "DAPO soft overlong punishment: penalty rises linearly from 0 to "
                              "-overlong_penalty over the last this-many tokens before "
                              "max_new_tokens (0 = off)", AT_LEAST_0)
    overlong_penalty: float = _f(1.0, "size of the overlong penalty at max_new_tokens",
                                 NON_NEGATIVE)
    rollout_correction: str = _f("none", "weight each sample's loss by pi_old / pi_sampler from "
                                 "the engine's log-probs: 'none', 'tis' (truncated at the cap) or "
                                 "'mis' (masked to 0 above the cap); docs/rollout_correction.md")
    rollout_correction_level: str = _f("token", "importance weight per 'token' (biased, low "
                                       "variance) or per 'sequence' (exact without a cap)")
    rollout_correction_cap: float = _f(
        2.0, "cap C >= 1 on the weight pi_old / pi_sampler (inf = no cap)")
    sampler_lag: int = _f(0, "K: step t samples with the policy of K updates before (the weights "
                          "after t-1-K updates, the initial ones for the first K steps) and keeps "
                          "the sampler's log-probs, as an asynchronous trainer does; pi_old stays "
                          "the policy at the start of step t, so --rollout-correction tis|mis "
                          "corrects the staleness (docs/trainer.md). 0: on-policy", AT_LEAST_0)
    pi_old: str = _f("current", "what pi_old is, against which the loss takes its ratio, its clip "
                     "and (--ref iterative) its KL: 'current', the policy at the start of the step "
                     "(log-probs recomputed; a stale sampler's samples are then off pi_old, which "
                     "--rollout-correction corrects: decoupled, as AReaL), or 'sampler', the "
                     "policy that drew the samples (the paper's Algorithm, x ~ pi_old: coupled). "
                     "The same without --sampler-lag", one_of("current", "sampler"))

    def _check_rollout(self):
        if self.overlong_buffer > self.max_new_tokens:
            _bad(f"--overlong-buffer must be in [0, --max-new-tokens {self.max_new_tokens}], got "
                 f"{self.overlong_buffer}")
        if self.dynamic_sampling and self.group_size < 2:
            _bad("--dynamic-sampling needs --group-size >= 2 (a group of one always has equal "
                 "rewards)")
        mode, level, cap = (self.rollout_correction, self.rollout_correction_level,
                            self.rollout_correction_cap)
        try:
            check_rollout_correction(mode, level, cap)
        except ValueError as e:  # named: the flag the message speaks of
            which = next((f"-{w}" for w in ("cap", "level") if f"correction {w}" in str(e)), "")
            _bad(f"--rollout-correction{which}: {e}")
        if mode == "none":
            given = [flag(k) for k in ("rollout_correction_level", "rollout_correction_cap")
                     if getattr(self, k) != DEFAULTS[k]]
            if given:
                _bad(f"{' and '.join(given)} given without --rollout-correction tis|mis; add one, "
                     f"or drop them")
            return
        if level == "token" and self.level == "sequence":
            _bad("--rollout-correction-level token weights tokens, but --level sequence makes a "
                 "whole response one unit of the loss; use --rollout-correction-level sequence")
        if self.top_p < 1:
            _bad(f"--rollout-correction {mode} with --top-p {self.top_p}: the sampler never draws "
                 f"tokens outside the nucleus, so pi_old / pi_sampler cannot restore them; use "
                 f"--top-p 1")
        why = getattr(resolve(ENGINES, self.engine, "engine"), "sampler_logprobs_missing",
                      lambda cfg: "it does not declare sampler_logprobs_missing "
                                  "(rpg_ref.interfaces.Engine)")(self)
        if why is not None:
            _bad(f"--rollout-correction {mode} needs the sampler's own log-probs, which engine "
                 f"{self.engine!r} does not report here ({why}); use --rollout-correction none "
                 f"or another --engine")

    # --- update ---
    mini_batch_size: int = _f(32, "responses per optimizer step", AT_LEAST_1)
    micro_batch_size: int = _f(
        0, "responses per forward/backward (gradient accumulation); 0 = mini-batch", AT_LEAST_0)
    micro_batch_tokens: int = _f(0, "at most this many tokens per forward/backward (rows x longest "
                                 "prompt+response; sequences sorted by length first; 0 = no "
                                 "limit)", AT_LEAST_0)
    logprob_chunk: int = _f(0, "response tokens per LM-head call in log-prob passes (0 = auto: "
                            "512 MiB of fp32 logits, 883 tokens for Qwen3's vocabulary)",
                            AT_LEAST_0)
    updates_per_step: int | None = _f(None, "K: max optimizer steps per rollout batch (None: "
                                      "one pass, batch / mini_batch_size)", AT_LEAST_1)
    kappa: float = _f(math.inf, "stop the inner loop when the running token-level "
                      "KL(pi_theta||pi_old) estimate exceeds this (inf = never)",
                      Rule("> 0 (inf: never)", lambda v: _num(v) and v > 0))
    lr: float = _f(1e-3, "AdamW learning rate", POSITIVE)
    weight_decay: float = _f(0.0, "AdamW weight decay", NON_NEGATIVE)
    adam_betas: list[float] = _f([0.9, 0.999], "AdamW betas", Rule(  # noqa: RUF009
        "two numbers in [0, 1)", lambda v: isinstance(v, (list, tuple)) and len(v) == 2
        and all(_num(b) and 0 <= b < 1 for b in v)))
    grad_clip: float = _f(1.0, "max gradient norm (0 = no clipping; the norm is logged either "
                          "way)", NON_NEGATIVE)
    warmup_steps: int = _f(0, "linear learning-rate warm-up, in training steps", AT_LEAST_0)
    lr_decay: str = _f("constant", "after warm-up: 'constant' or 'cosine' (to 0 at the last step)",
                       one_of("constant", "cosine"))

    def _check_update(self):
        n = self.prompts_per_step * self.group_size
        if n % self.mini_batch_size:
            _bad(f"the batch ({self.prompts_per_step} prompts x {self.group_size} = {n} "
                 f"responses) is not divisible into mini-batches of --mini-batch-size "
                 f"{self.mini_batch_size}")
        if self.micro_batch_size and self.mini_batch_size % self.micro_batch_size:
            _bad(f"--mini-batch-size {self.mini_batch_size} is not divisible into micro-batches "
                 f"of --micro-batch-size {self.micro_batch_size}")
        self.adam_betas = [float(b) for b in self.adam_betas]

    # --- logging / checkpoints ---
    eval_every: int = _f(0, "evaluate every this many steps (0 = only at the end)", AT_LEAST_0)
    save_every: int = _f(10, "checkpoint every this many steps (and at the end)", AT_LEAST_1)
    keep_checkpoints: int = _f(1, "checkpoints kept on disk: the latest N (0 = all)", AT_LEAST_0)
    progress: bool = _f(True, "progress bar (tqdm when installed)")
    tensorboard: bool = _f(False, "also log to TensorBoard (needs the tensorboard package)")

    # --- the task's and the engine's Options: each option is a flag of its own,
    # --<task>-<option> or --<engine>-<option> (plugin_options) ---
    task_options: NoFlag = _f({}, "the task's Options")  # noqa: RUF009
    engine_options: NoFlag = _f({}, "the engine's Options")  # noqa: RUF009

    def _fill_options(self):
        """Resolve engine 'auto'; complete each Options from its defaults and check it (its
        __post_init__)."""
        self.engine = engine_for(self.task, self.engine)
        for key, cls, name in (("task_options", resolve(TASKS, self.task, "task"), self.task),
                               ("engine_options", resolve(ENGINES, self.engine, "engine"),
                                self.engine)):
            opts = getattr(cls, "Options", None)
            known = {f.name for f in dataclasses.fields(opts)} if opts else set()
            unknown = set(getattr(self, key)) - known
            if unknown:
                _bad(f"unknown {key} for {name}: {sorted(unknown)}; valid: {sorted(known)}")
            if opts:
                setattr(self, key, dataclasses.asdict(opts(**getattr(self, key))))

    def __post_init__(self):
        for f in dataclasses.fields(self):  # each field's own rule
            rule, v = f.metadata["rule"], getattr(self, f.name)
            if rule and v is not None and not rule.ok(v):
                _bad(f"{flag(f.name)} must be {rule.words}, got {v!r}")
        self._check_run()
        self._fill_options()
        self._check_algorithm()
        self._check_rollout()
        self._check_update()


def default_of(f: dataclasses.Field):
    return f.default if f.default_factory is dataclasses.MISSING else f.default_factory()


DEFAULTS = {f.name: default_of(f) for f in dataclasses.fields(Config)}


def engine_for(task: str, engine: str) -> str:
    """The engine a run uses: --engine, or for 'auto' the task's default."""
    return resolve(TASKS, task, "task").default_engine if engine == "auto" else engine


def loss_options(cfg: Config) -> LossOptions:
    """The run's loss options, resolved here and nowhere else: beta (None: DEFAULT_BETA, or 0 for
    a loss with no KL term) and where it goes (the loss, or the reward for reinforce++), the clip
    bounds (the loss's default without --clip), level and aggregation. The Config keeps the beta
    resolved here; the loop reads everything else from the options (train.Run.loss)."""
    spec = SPECS.get(cfg.algo)  # an unknown name: resolve_options lists the valid ones
    beta = spec.default_beta(DEFAULT_BETA) if cfg.beta is None and spec else cfg.beta
    return resolve_options(cfg.algo, beta=beta, clip=cfg.clip, level=cfg.level,
                             agg=cfg.agg, no_clip=cfg.no_clip, run=True)


def resolved_adv(cfg: Config) -> str:
    return SPECS[cfg.algo].advantage if cfg.adv == "auto" else cfg.adv


def plugin_options() -> dict[str, tuple[str, str, type, dataclasses.Field]]:
    """"<name>_<option>" -> (kind, name, Options class, field) for every option of every
    registered task and engine: the flag --<name>-<option> (a "-" in a name reads as "_" in the
    key, which must be an identifier)."""
    table = {}
    for kind, registry in (("task", TASKS), ("engine", ENGINES)):
        for name in registry:
            opts = getattr(resolve(registry, name, kind, quiet=True), "Options", None)
            for f in dataclasses.fields(opts) if opts else ():
                table[f"{name.replace('-', '_')}_{f.name}"] = (kind, name, opts, f)
    return table


def preset_for(task: str | None, preset: str | None) -> str:
    """The preset a run uses: the one named, else the one named like the task, else (no task
    named) the default. A registered task with no preset of its own is refused without --preset:
    another task's max-new-tokens, learning rate and clip would not fit it."""
    if preset is None and task is not None and task not in PRESETS and task in TASKS:
        _bad(f"task {task!r} has no preset of its own, and another task's values (max-new-tokens, "
             f"lr, clip) would not fit it: name the one to start from with --preset NAME (one of "
             f"{', '.join(PRESETS)}), or add a preset named {task!r} to "
             f"rpg_ref/trainer/presets.py")
    name = preset or (task if task in PRESETS else DEFAULT_PRESET)
    if name not in PRESETS:
        _bad(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return name


def from_preset(preset: str | None = None, **given) -> Config:
    """The Config of `rpg-train --preset PRESET --<key> VALUE ...`: the preset's values (default:
    the one named like the task, else seq), then ``given`` (keys as in PRESETS). A preset's beta
    gives way to a loss with no KL term (dapo: 0) and its clip to no_clip."""
    name = preset_for(given.get("task"), preset)
    values = {**copy.deepcopy(PRESETS[name]), **given, "preset": name}
    spec = SPECS.get(values.get("algo", DEFAULTS["algo"]))
    if "beta" not in given and spec is not None and not spec.has_kl:
        values.pop("beta", None)
    if given.get("no_clip") and "clip" not in given:
        values.pop("clip", None)
    table = plugin_options()
    task = values.get("task", DEFAULTS["task"])
    engine = engine_for(task, values.get("engine", DEFAULTS["engine"]))
    mine: dict[str, dict] = {"task": {}, "engine": {}}
    for key in [k for k in values if k in table]:
        kind, owner, _, f = table[key]
        if owner != (task if kind == "task" else engine):
            _bad(f"{flag(key)} is an option of {kind}:{owner}, but this run uses "
                 f"task {task!r} and engine {engine!r}")
        mine[kind][f.name] = values.pop(key)
    return Config(**values, task_options=mine["task"], engine_options=mine["engine"])
