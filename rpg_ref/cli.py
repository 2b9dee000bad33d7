"""rpg-train's command line: flags -> a checked Config -> rpg_ref.trainer.train.train.

    rpg-train [--preset NAME] [--<field> VALUE ...] [--<task>-<option> VALUE ...]
    rpg-train --resume OUT [--steps N]

tyro reads the flags off the Config dataclass (rpg_ref/trainer/config.py) and every registered
task's and engine's ``Options``, so ``--help`` is the dataclasses' own text; the Config is then
built from the preset and the flags given (config.from_preset). A bad configuration is one line on
stderr and exit code 2, before anything is written; a usage error (unknown flag, bad value) two
lines. Ctrl-C (SIGINT) or SIGTERM ends a run with one line naming the step reached, what is saved
and the --resume command, exit code 130 / 143 (rpg_ref/trainer/interrupts.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import re
import shlex
import signal
import sys
import threading
import typing
from pathlib import Path
from typing import Annotated

import tyro

from rpg_ref.core.losses import LOSSES
from rpg_ref.trainer import run_folder
from rpg_ref.trainer.collectives import is_main
from rpg_ref.trainer.config import (
    DEFAULT_BETA,
    DEFAULTS,
    Config,
    default_of,
    from_preset,
    plugin_options,
    preset_for,
)
from rpg_ref.trainer.config_checks import check_machine, check_out, resume_config
from rpg_ref.trainer.distributed.liveness import (
    mark_stopping,
    peer_failure,
    peers_stopping,
    silent_peers,
)
from rpg_ref.trainer.distributed.setup import agree, exit_process, shutdown, tell_torchrun
from rpg_ref.trainer.errors import DiskFull, Diverged, ResumeError
from rpg_ref.trainer.interrupts import interrupted_message, peer_line, raise_interrupted
from rpg_ref.trainer.metrics import failure_line
from rpg_ref.trainer.presets import DEFAULT_PRESET, PRESETS
from rpg_ref.trainer.train import finished, prepare, train

# in the default --out's name, or (as for the output-folder check) not part of a run's identity
OUT_NAME_KEYS = ("preset", "task", "algo", "seed", "out", "resume", "progress", "tensorboard")
DESCRIPTION = "\n".join((  # one line each (tyro does not wrap it: no name is cut at a hyphen)
    f"Train with the RPG paper's losses (rpg_ref/trainer/train.py). The defaults shown are what "
    f"runs with no flags: the preset {DEFAULT_PRESET!r}.",
    f"--preset NAME (or --task NAME) starts from another preset's values: {', '.join(PRESETS)}.",
    f"--algo is one of: {', '.join(LOSSES)}."))


def _flags_class(table: dict) -> type:
    """Config's fields and, in a group of their own, every task's and engine's options: the values
    tyro reads, unchecked (the Config is built from them and the preset by parse_config)."""
    options = dataclasses.make_dataclass("Options", [
        (key, typing.get_type_hints(opts)[f.name], dataclasses.field(
            default=f.default, default_factory=f.default_factory,
            metadata={**f.metadata, "help": f"[{kind}:{name}] {f.metadata['help']}"}))
        for key, (kind, name, opts, f) in table.items()])
    return dataclasses.make_dataclass("Flags", [
        ("task_and_engine", Annotated[options, tyro.conf.OmitArgPrefixes],
         dataclasses.field(default_factory=options)),
    ], bases=(Config,), namespace={"__post_init__": lambda self: None})


def _one_line(box: str) -> str:
    """tyro's error box -> its message on one line (the first paragraph inside the box)."""
    lines = []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", box).strip().splitlines()[1:]:  # [0]: the title
        text = line.strip().strip("│|").strip()
        if not text or set(text) <= set("─-"):  # a blank line or a rule: the paragraph's end
            if lines:
                break
            continue
        lines.append(text)
    return " ".join(lines) or "the command line cannot be read"


def read_flags(argv: list) -> dict:
    """argv -> {field or "<name>_<option>": value} for each flag given (tyro checks the syntax)."""
    table = plugin_options()
    flags_cls = _flags_class(table)
    preset = {k: v for k, v in PRESETS[DEFAULT_PRESET].items() if k not in table}
    default = flags_cls(**{**preset, "preset": DEFAULT_PRESET})  # --help shows what runs
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            flags = tyro.cli(flags_cls, args=argv, default=default, prog="rpg-train",
                             description=DESCRIPTION)
    except SystemExit as e:
        if not e.code:
            raise  # --help
        raise ValueError(f"{_one_line(err.getvalue())}\nrun `rpg-train --help` for every "
                         f"option") from None
    sys.stderr.write(err.getvalue())  # tyro's warnings, if any
    given = {}
    for key in (a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")):
        key = key[3:] if key not in DEFAULTS and key not in table and key[:3] == "no_" else key
        if key in DEFAULTS or key in table:  # a field, or a task's or engine's option
            given[key] = getattr(flags if key in DEFAULTS else flags.task_and_engine, key)
    return given


def help_text() -> str:
    """What `rpg-train --help` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        read_flags(["--help"])
    return out.getvalue()


def parse_config(argv: list | None = None) -> Config:
    """argv -> checked Config. Raises ValueError with a clear message on a bad configuration."""
    return config_of(read_flags(sys.argv[1:] if argv is None else list(argv)))


def config_of(given: dict) -> Config:
    """The flags given (read_flags) -> checked Config: the stored run's for --resume, else the
    preset's with the flags applied; then what the Config cannot see in itself (the machine, the
    run folder)."""
    if "resume" in given:
        cfg = resume_config(given)
    else:
        name = preset_for(given.get("task"), given.get("preset"))
        try:
            cfg = from_preset(**given)
        except ValueError as e:  # + each flag it names whose value came from the preset
            notes = [f"--{flag} {PRESETS[name][key]} came from --preset {name}"
                     for flag in dict.fromkeys(re.findall(r"--([a-z][a-z0-9-]*)", str(e)))
                     if (key := flag.replace("-", "_")) in PRESETS[name] and key not in given]
            raise ValueError(f"{e} ({'; '.join(notes)})" if notes else str(e)) from None
        if cfg.out is None:
            cfg.out = default_out(cfg, given)
    check_machine(cfg)
    check_out(cfg)
    return cfg


def default_out(cfg: Config, given: dict) -> str:
    """runs/<task, or the preset when it is not the task's own>-<algo>-s<seed>, plus the first 6 hex
    digits of a hash of the flags that change the preset's values (sorted: their order does not
    matter). Two configurations never share a folder; the run with no flags stays
    runs/seq-rpg-reinforce-urkl-s0."""
    name = cfg.task if cfg.preset == cfg.task else cfg.preset
    options = {k: default_of(f) for k, (*_, f) in plugin_options().items()}
    defaults = {**DEFAULTS, "beta": DEFAULT_BETA, **options, **PRESETS[cfg.preset]}
    changed = {k: v for k, v in given.items()
               if k not in OUT_NAME_KEYS and defaults.get(k, object()) != v}
    if not changed:
        return f"runs/{name}-{cfg.algo}-s{cfg.seed}"
    digest = hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()
    return f"runs/{name}-{cfg.algo}-s{cfg.seed}-{digest[:6]}"


class Attempt:
    """One rpg-train command as far as it got: what ``ending`` needs to say how it ended."""

    def __init__(self, argv: list):
        self.argv, self.cfg, self.lock, self.run, self.training = argv, None, None, None, False


def main(argv: list | None = None) -> int:
    """rpg-train: flags -> a checked Config -> train -> the final line. However a run ends, its exit
    code and its one line come from ``ending``."""
    a = Attempt(sys.argv[1:] if argv is None else list(argv))
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_interrupted) if in_main_thread else None
    try:
        summary = start(a)
    except BaseException as e:  # noqa: BLE001 - ending() raises what is no run's ending
        code, line, everyone = ending(e, a)
        if in_main_thread:  # ending anyway: torchrun's SIGTERM to a rank that is exiting is moot
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if line is not None:
            if everyone or is_main():
                print(line, file=sys.stderr)
            tell_torchrun(line)
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if a.lock is not None:
            a.lock.release()
    shutdown()
    if not is_main():
        return 0
    print(done_line(a.cfg.out, summary))
    if summary.get("note"):  # what the numbers above mean for this task (e.g. a random model)
        print(f"note: {summary['note']}")
    return 0


def done_line(out: str, summary: dict) -> str:
    """The last step's reward and accuracy, then the task's evaluation (named as the task calls
    it: held-out problems, or exact values), each beside its value at step 0 when it has one."""
    f, at_start = summary["final"], summary.get("eval_at_start", {})
    evals = "  ".join(f"{k.removeprefix('eval_')}={v:.3f}"
                      + (f" (step 0: {at_start[k]:.3f})" if k in at_start else "")
                      for k, v in summary["eval"].items())
    return (f"done: {out}  reward={f.get('reward', float('nan')):.3f}  "
            f"accuracy={f.get('accuracy', float('nan')):.3f}"
            + (f"  tv_distance={summary['tv_distance']:.4f}"
               if summary.get("tv_distance") is not None else "")
            + (f"  {summary.get('evaluation', 'evaluation')}: {evals}" if evals else ""))


def start(a: Attempt) -> dict:
    """Parse the flags once, take the run folder, build, train. Every user mistake (flags, data,
    model, device, folder) is refused before OUT is written; under torchrun every rank refuses
    together (distributed.setup.agree)."""
    def checked():
        given = read_flags(a.argv)
        return given, config_of(given)

    def take_folder():  # one writer per run folder: rank 0 holds it
        if not is_main():
            return a.cfg
        a.lock = run_folder.claim(a.cfg.out)
        return config_of(given)  # the folder's checks again, now that no one else writes

    given, a.cfg = agree(checked)
    if finished(a.cfg):
        if is_main():
            print(f"rpg-train: {a.cfg.out} already finished {a.cfg.steps} steps; nothing to do "
                  f"(pass --steps N to extend it)")
    else:
        a.cfg = agree(take_folder)
        a.run = prepare(a.cfg)
    a.training = True
    return train(a.cfg, a.run)


def ending(e: BaseException, a: Attempt) -> tuple[int, str | None, bool]:
    """How a run that raised ``e`` ends: (exit code, its line or None, whether every rank prints
    it; else rank 0 alone does). Re-raises ``e`` when it is no user's mistake, fault or signal (a
    bug: its traceback)."""
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C (SIGINT) or SIGTERM: a line, no traceback
        signum = getattr(e, "signum", signal.SIGINT)
        mark_stopping()
        # torchrun stops every rank with SIGTERM when one died: the reason, if that is it
        if any(p.endswith("has exited") for p in silent_peers()):
            why = f"torchrun stopped this rank with {signal.Signals(signum).name}"
            return 128 + signum, f"rpg-train: {peer_line(why, 0.0)}", True
        mine = a.cfg if a.lock is not None else None  # a folder it does not hold is not its run
        return 128 + signum, interrupted_message(mine, signum), False
    if not a.training:
        if not isinstance(e, ValueError):
            raise e
        # a user's mistake (flags, data, model, device, folder); a folder in use is the reason
        return 2, f"rpg-train: {run_folder.busy(a.argv, str(e)) or e}", False
    if isinstance(e, (ResumeError, DiskFull, Diverged)):  # one line each; ResumeError: bad input
        return (2 if isinstance(e, ResumeError) else 1), f"rpg-train: {e}", False
    if peer_failure(e):
        if peers_stopping():
            return 128 + signal.SIGTERM, None, True  # torchrun stops the job: that rank says so
        return 1, f"rpg-train: {peer_line(str(e).splitlines()[0][:160])}", True
    cfg = a.cfg
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return 1, (f"rpg-train: no space left on the device of {cfg.out} ({e.filename or e}); "
                   f"free some space and continue with: rpg-train --resume "
                   f"{shlex.quote(cfg.out)}"), True
    # values that became non-finite inside a step
    line = failure_line(e, Path(cfg.out), cfg, list(a.run.policy.parameters()) if a.run else [])
    if line is None:
        raise e
    return 1, f"rpg-train: {line}", True


if __name__ == "__main__":
    exit_process(main())
