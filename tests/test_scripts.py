"""rpg_ref/scripts.py: Ctrl-C while a console script is still importing torch (its first seconds)
is one line and exit code 130, as Ctrl-C later is. A real process gets a real SIGINT at the moment
the import of a named module begins (an import hook signals its own process: deterministic)."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny_runs import sigint_as_in_a_terminal

from rpg_ref import scripts

CHILD = textwrap.dedent("""
    import os, signal, sys

    class SignalAt:  # sends this process SIGINT when the import of `target` begins
        def find_spec(self, name, path=None, target=None):
            if name == {target!r}:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)  # delivered before kill returns
            return None

    sys.meta_path.insert(0, SignalAt())
    from rpg_ref import scripts
    sys.argv = [{command!r}, *{args!r}]
    sys.exit(getattr(scripts, {function!r})())
""")

# the module whose import is under way when Ctrl-C comes: torch.nn is imported by torch's own
# __init__ (torch._C is loaded by then), so the signal lands in the middle of `import torch`.
# rpg-eval imports torch once its arguments pass the up-front checks (a folder that looks like a
# model: config.json with a model_type, a weights file, a tokenizer file; a problem file);
# rpg-plot imports matplotlib, not torch, once it has a run folder to draw; rpg-figs imports torch
# when it draws its first figure.
ARGS = {"rpg-eval": ["--model", "model", "--data", "problems.jsonl"], "rpg-plot": ["some-run"],
        "rpg-figs": []}
CASES = [(c, "matplotlib" if c == "rpg-plot" else "torch.nn", ARGS.get(c, []))
         for c in scripts.COMMANDS]


def _run(command: str, target: str, args: list) -> subprocess.CompletedProcess:
    Path("problems.jsonl").write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    Path("model").mkdir(exist_ok=True)  # never loaded: the signal comes while torch imports
    for name, text in (("config.json", '{"model_type": "qwen3"}'),
                       ("model.safetensors", ""), ("tokenizer.json", "{}")):
        Path("model", name).write_text(text)
    code = CHILD.format(target=target, command=command, args=args,
                        function=command.replace("-", "_"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, preexec_fn=sigint_as_in_a_terminal)


def test_every_console_script_goes_through_the_handler():
    """pyproject.toml's console scripts are exactly COMMANDS, each pointing at its wrapper."""
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    section = text.split("[project.scripts]\n")[1].split("\n\n")[0]
    assert dict(re.findall(r'^(\S+) = "(\S+)"$', section, re.M)) == {
        c: f"rpg_ref.scripts:{c.replace('-', '_')}" for c in scripts.COMMANDS
    }


@pytest.mark.parametrize("command,target,args", CASES, ids=[c for c, _, _ in CASES])
def test_ctrl_c_during_the_first_imports_is_one_line(command, target, args):
    r = _run(command, target, args)
    # rpg-eval and rpg-plot have started (read their arguments) when they import torch/matplotlib
    when = "" if command in ARGS else " while starting; nothing was done"
    assert (r.returncode, r.stderr) == (130, f"{command}: interrupted (SIGINT){when}\n"), r.stderr
    assert r.stdout == ""
