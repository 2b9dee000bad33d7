"""The console scripts of pyproject.toml ([project.scripts]): each imports its command inside
``run``, so that Ctrl-C in the first seconds, while torch and the rest import, ends with one line
and exit code 130, as Ctrl-C later does, instead of a traceback through the import machinery.
This module imports nothing heavy (tests/test_scripts.py signals a real process mid-import)."""

from __future__ import annotations

import importlib
import signal
import sys

# console script -> "module:function" (the function reads sys.argv and returns the exit code)
COMMANDS = {
    "rpg-train": "rpg_ref.cli:main",
    "rpg-eval": "rpg_ref.math.evaluation:main",
    "rpg-audit": "rpg_ref.audit:main",
    "rpg-verify": "derivations.__main__:main",
    "rpg-figs": "paper_figs.__main__:main",
    "rpg-plot": "rpg_ref.plot:main",
    "rpg-demo": "rpg_ref.demo:main",
}


def run(command: str) -> int:
    """Import COMMANDS[command] and call it; a KeyboardInterrupt (Ctrl-C, or rpg-train's SIGTERM)
    that reaches here is one line on stderr and exit code 128 + the signal."""
    started = False
    try:
        module, function = COMMANDS[command].split(":")
        main = getattr(importlib.import_module(module), function)
        started = True
        return main() or 0
    except KeyboardInterrupt as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot cut this line short
        signum = getattr(e, "signum", signal.SIGINT)
        when = "" if started else " while starting; nothing was done"
        print(f"{command}: interrupted ({signal.Signals(signum).name}){when}", file=sys.stderr)
        return 128 + signum


def rpg_train() -> int:
    return run("rpg-train")


def rpg_eval() -> int:
    return run("rpg-eval")


def rpg_audit() -> int:
    return run("rpg-audit")


def rpg_verify() -> int:
    return run("rpg-verify")


def rpg_figs() -> int:
    return run("rpg-figs")


def rpg_plot() -> int:
    return run("rpg-plot")


def rpg_demo() -> int:
    return run("rpg-demo")
