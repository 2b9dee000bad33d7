"""rpg-train's command line: flags -> a validated Config -> rpg_ref.trainer.train.train.

    rpg-train [--preset NAME] [--<field> VALUE ...] [--<task>-<option> VALUE ...]
    rpg-train --resume OUT [--steps N]

The flags are generated from the Config dataclass (rpg_ref/trainer/config.py) and from every
registered task's and engine's ``Options`` dataclass, so ``--help`` is always the dataclasses' own
text. A bad configuration is one line on stderr and exit code 2, before anything is written; a usage
error (unknown flag, bad value) two lines. Ctrl-C (SIGINT) or SIGTERM ends a run with one line
naming the step reached, what is saved and the --resume command, exit code 130 / 143.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import errno
import hashlib
import json
import re
import shlex
import signal
import sys
import textwrap
import threading
import typing
from pathlib import Path
from typing import Any

import rpg_ref.core.losses as L
from rpg_ref.registry import ENGINES, TASKS, resolve
from rpg_ref.strict_json import loads
from rpg_ref.trainer import distributed as D
from rpg_ref.trainer import run_folder
from rpg_ref.trainer.checkpoint import DiskFull, ResumeError, latest_step
from rpg_ref.trainer.config import (
    DEFAULT_PRESET,
    PRESETS,
    Config,
    fill_options,
    preset_for,
    validate,
)
from rpg_ref.trainer.metrics import Diverged, failure_line
from rpg_ref.trainer.train import finished, prepare, train

RESUME_CHANGEABLE = (
    "steps",
    "progress",
    "tensorboard",
    "eval_every",
    "save_every",
    "keep_checkpoints",
    "dist_timeout",
)


def _cli_type(tp) -> Any:
    """The element type of a field annotation (``int | None`` -> int)."""
    args = typing.get_args(tp)
    if type(None) in args:
        return next(a for a in args if a is not type(None))
    return tp


def option_flags() -> list[tuple[str, str, dataclasses.Field, str, Any]]:
    """(dest, flag, field, owner, type) for every registered task's and engine's Options field."""
    out = []
    for kind, registry in (("task", TASKS), ("engine", ENGINES)):
        for name in registry:
            cls = resolve(registry, name, kind, quiet=True)
            if cls is None or not hasattr(cls, "Options"):
                continue
            hints = typing.get_type_hints(cls.Options)
            for f in dataclasses.fields(cls.Options):
                dest = f"{name}_{f.name}"
                out.append((dest, "--" + dest.replace("_", "-"), f, f"{kind}:{name}",
                            _cli_type(hints[f.name])))
    return out


def _default(f: dataclasses.Field):
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


class UsageError(ValueError):
    """A command line argparse cannot read (unknown flag, missing or mistyped value)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # two lines, not the 60-line usage argparse prints first
        raise UsageError(f"{message}\nrun `rpg-train --help` for every option")


class _Formatter(argparse.HelpFormatter):
    """Wraps help text at spaces only: a loss name such as rpg-reinforce-urkl stays whole."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rpg-train",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
        formatter_class=_Formatter,
        description=f"Train with the RPG paper's losses (rpg_ref/trainer/train.py). The defaults "
        f"shown are what runs with no flags: the preset {DEFAULT_PRESET!r}. --preset NAME (or "
        f"--task NAME) starts from another preset's values ({', '.join(PRESETS)}). "
        f"--algo is one of: {', '.join(L.LOSSES)}.",
    )
    hints, preset = typing.get_type_hints(Config), PRESETS[DEFAULT_PRESET]
    for f in dataclasses.fields(Config):
        if not f.metadata.get("cli", True):
            continue
        tp, flag = _cli_type(hints[f.name]), "--" + f.name.replace("_", "-")
        default = (f"{preset[f.name]}, from preset {DEFAULT_PRESET!r}" if f.name in preset
                   else _default(f))
        helptext = f"{f.metadata['help']} (default: {default})"
        if tp is bool and f.name.startswith("no_"):
            p.add_argument(flag, action="store_true", help=helptext)
        elif tp is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=helptext)
        elif tp in (list, tuple) or "nargs" in f.metadata:
            p.add_argument(flag, nargs=f.metadata.get("nargs", "+"), type=str, help=helptext)
        else:
            p.add_argument(flag, type=tp, help=helptext)
    group = p.add_argument_group("task and engine options")
    for dest, flag, f, owner, tp in option_flags():
        helptext = f"[{owner}] {f.metadata.get('help', '')} (default: {_default(f)})"
        if tp is bool:
            group.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, help=helptext
            )
        elif tp in (list, tuple) or typing.get_origin(tp) in (list, tuple):
            elem = (typing.get_args(tp) or (str,))[0]  # list[float] -> float
            group.add_argument(flag, dest=dest, nargs="+", type=elem, help=helptext)
        else:
            group.add_argument(flag, dest=dest, type=tp, help=helptext)
    return p


def _typed(flags: dict) -> dict:
    """Flag strings -> config values: --clip through the loss library's parser, betas to floats."""
    flags = dict(flags)
    if flags.get("clip") is not None:
        try:  # the loss library's rule refuses a malformed or out-of-range clip
            L.parse_clip(flags["clip"])
        except ValueError as e:
            raise ValueError(
                f"bad configuration: --clip {' '.join(map(str, flags['clip']))}: {e}"
            ) from None
        flags["clip"] = [float(v) for v in flags["clip"]]  # stored as given ('inf' stays inf)
    if "adam_betas" in flags:
        flags["adam_betas"] = [float(v) for v in flags["adam_betas"]]
    return flags


def parse_config(argv: list | None = None) -> Config:
    """argv -> validated Config. Raises ValueError with a clear message on a bad configuration."""
    flags = vars(build_parser().parse_args(argv))
    if "resume" in flags:
        return _resume_config(flags)
    name = preset_for(flags.get("task"), flags.get("preset"))
    values = {**copy.deepcopy(PRESETS[name]), **_typed(flags), "preset": name}
    if flags.get("no_clip") and "clip" not in flags:
        values["clip"] = None  # --no-clip beats a preset's clip
    owners = {dest: owner for dest, _, _, owner, _ in option_flags()}
    options = {k: values.pop(k) for k in list(values) if k in owners}
    cfg = Config(**values)
    if "beta" not in flags and cfg.algo in L.LOSSES:
        cfg.beta = L.default_beta(cfg.algo, cfg.beta)  # e.g. dapo: no KL, so 0 unless asked
    fill_options(cfg, options, owners)
    if cfg.out is None:
        cfg.out = default_out(cfg, name, flags)
    try:
        validate(cfg)
    except ValueError as e:
        raise ValueError(f"{e}{_from_preset(str(e), name, flags)}") from None
    return cfg


# in the default --out's name, or (as for the output-folder check) not part of a run's identity
OUT_NAME_KEYS = ("preset", "task", "algo", "seed", "out", "resume", "progress", "tensorboard")


def default_out(cfg: Config, preset: str, flags: dict) -> str:
    """runs/<task, or the preset when it is not the task's own>-<algo>-s<seed>, plus the first 6 hex
    digits of a hash of the flags that change the preset's values (sorted: their order does not
    matter). Two configurations never share a folder; the run with no flags stays
    runs/seq-rpg-reinforce-urkl-s0."""
    name = cfg.task if preset == preset_for(cfg.task, None) else preset
    defaults = {f.name: _default(f) for f in dataclasses.fields(Config)}
    defaults.update({dest: _default(f) for dest, _, f, _, _ in option_flags()})
    defaults.update(PRESETS[preset])
    changed = {k: v for k, v in _typed(flags).items()
               if k not in OUT_NAME_KEYS and defaults.get(k, object()) != v}
    if not changed:
        return f"runs/{name}-{cfg.algo}-s{cfg.seed}"
    digest = hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[
        :6
    ]
    return f"runs/{name}-{cfg.algo}-s{cfg.seed}-{digest}"


def _from_preset(message: str, preset: str, flags: dict) -> str:
    """'; --x V came from preset P' for each flag the message names that the user did not give."""
    notes = []
    for flag in dict.fromkeys(re.findall(r"--([a-z][a-z0-9-]*)", message)):
        key = flag.replace("-", "_")
        if key in PRESETS[preset] and key not in flags:
            notes.append(f"--{flag} {PRESETS[preset][key]} came from --preset {preset}")
    return f" ({'; '.join(notes)})" if notes else ""


def _resume_config(flags: dict) -> Config:
    """The stored config of run folder DIR, continued in DIR (wherever the run was first written:
    a moved folder, or a relative --out resumed from another working directory, stays where it
    is)."""
    out = Path(flags["resume"])
    if "out" in flags:
        raise ValueError(f"--resume {out} continues the run in {out}: drop --out")
    path = out / "config.json"
    if not path.is_file():
        raise ValueError(f"--resume {out}: no run there ({path} not found)")
    try:
        stored = loads(path.read_text())
        cfg = Config(**stored)
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"--resume {out}: {path} is not an rpg-train config ({e})") from e
    if wrong := run_folder.mistyped(stored, path):
        raise ValueError(f"--resume {out}: {wrong}")
    given = _typed(
        {k: v for k, v in flags.items() if k not in (*RESUME_CHANGEABLE, "resume", "out")}
    )
    differ = {k: (stored.get(k), v) for k, v in given.items() if stored.get(k, None) != v}
    if differ:
        raise ValueError(
            f"--resume {out}: flags differ from the stored run's config: {differ}; only "
            f"{sorted(RESUME_CHANGEABLE)} may change on resume"
        )
    for k in RESUME_CHANGEABLE:
        if k in flags:
            setattr(cfg, k, flags[k])
    cfg.resume = cfg.out = str(out)
    reached = latest_step(out)
    if cfg.steps < reached:
        raise ValueError(f"--resume {out}: --steps {cfg.steps} is below the step the run has "
                         f"reached ({reached}); pass --steps >= {reached}")
    validate(cfg)
    return cfg


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that both end a run the same way."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def interrupted_message(cfg: Config | None, signum: int) -> str:
    """One line: the signal, the step reached, what is saved, and the command that continues."""
    name = signal.Signals(signum).name
    out = Path(cfg.out) if cfg is not None and cfg.out else None
    if out is None or not (out / "config.json").is_file():
        return f"rpg-train: interrupted ({name}) before the run started; nothing was written"
    metrics = out / "metrics.jsonl"
    done = metrics.read_text().count("\n") if metrics.is_file() else 0  # complete rows: steps done
    saved = latest_step(out)
    kept = (f"checkpoint of step {saved} in {out / 'checkpoints'}" if saved
            else "no checkpoint yet (the run restarts from step 1; the same command works too)")
    return (f"rpg-train: interrupted ({name}) after step {done} of {cfg.steps}; saved: {kept}; "
            f"continue with: rpg-train --resume {shlex.quote(str(out))}")


def _busy(argv: list | None, error: str) -> str | None:
    """The lock holder's line when the folder a refusal names (--resume DIR or --out DIR on the
    command line) is in use: that is the reason."""
    args = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in ("--resume", "--out"):
            folder = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if folder and folder in error:
                return run_folder.in_use(Path(folder))
    return None


def _peer_line(what: str, wait_s: float = 4.0) -> str:
    """This rank stopped because another failed: which one, when the heartbeats tell."""
    who = D.silent_peers(wait_s)
    where = (f"{'; '.join(who)}: look there first (torchrun's report names the first rank to exit)"
             if who else "torchrun's report names the rank that failed first")
    return (f"rank {D.rank()} stopped: another rank died or stopped responding ({what}); "
            f"{where}")


def main(argv: list | None = None) -> int:
    cfg = lock = None
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        # every user mistake (flags, data, model, device, folder) is caught before OUT is written
        try:
            cfg = parse_config(argv)
            if D.is_main() and not finished(cfg):  # one writer per run folder (rank 0 holds it)
                lock = run_folder.claim(cfg.out)
                cfg = parse_config(argv)  # the folder's checks again, now that no one else writes
            run = None if finished(cfg) else prepare(cfg)
        except ValueError as e:
            print(f"rpg-train: {(D.is_main() and _busy(argv, str(e))) or e}", file=sys.stderr)
            return 2
        if run is None:
            print(f"rpg-train: {cfg.out} already finished {cfg.steps} steps; nothing to do "
                  f"(pass --steps N to extend it)")
        try:
            s = train(cfg, run)
        except (ResumeError, DiskFull, Diverged) as e:  # one line each; ResumeError: bad input
            if D.is_main():
                print(f"rpg-train: {e}", file=sys.stderr)
            return 2 if isinstance(e, ResumeError) else 1
        except Exception as e:
            if D.peer_failure(e):
                if D.peers_stopping():
                    return 128 + signal.SIGTERM  # torchrun stops the job: that rank says so
                line = _peer_line(str(e).splitlines()[0][:160])
            elif isinstance(e, OSError) and e.errno == errno.ENOSPC:
                line = (f"no space left on the device of {cfg.out} ({e.filename or e}); free some "
                        f"space and continue with: rpg-train --resume {shlex.quote(cfg.out)}")
            else:  # values that became non-finite inside a step
                line = failure_line(e, Path(cfg.out), cfg, list(run.policy.parameters()))
            if line is None:
                raise
            print(f"rpg-train: {line}", file=sys.stderr)
            return 1
    except KeyboardInterrupt as e:  # Ctrl-C (SIGINT) or SIGTERM: a line, no traceback
        signum = getattr(e, "signum", signal.SIGINT)
        D.mark_stopping()
        # torchrun stops every rank with SIGTERM when one died: the reason, if that is it
        dead = [p for p in D.silent_peers() if p.endswith("has exited")]
        if dead:
            why = f"torchrun stopped this rank with {signal.Signals(signum).name}"
            print(f"rpg-train: {_peer_line(why, 0.0)}", file=sys.stderr)
        elif D.is_main():  # under torchrun every rank gets the signal: one line is enough
            mine = cfg if lock is not None else None  # a folder it does not hold is not its run
            print(
                ("\n" if cfg is not None and cfg.progress else "")
                + interrupted_message(mine, signum),
                file=sys.stderr,
            )
        return 128 + signum
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if lock is not None:
            lock.release()
    D.shutdown()
    if not D.is_main():
        return 0
    f = s["final"]
    print(f"done: {cfg.out}  reward={f.get('reward', float('nan')):.3f}  "
          f"accuracy={f.get('accuracy', float('nan')):.3f}"
          + (f"  tv_distance={s['tv_distance']:.4f}" if s.get("tv_distance") is not None else "")
          + "".join(f"  {k}={v:.3f}" for k, v in s["eval"].items()))
    return 0


if __name__ == "__main__":
    D.exit_process(main())
