"""README.md top to bottom, as a newcomer runs it: the quick start's training run, then every
command of "A short tour" in the order written, in an empty working folder (what a fresh clone
holds before its first run). Each exits with 0 and prints nothing that looks like an error, and the
commands chain: the resume continues the run the tour trained, rpg-plot draws runs that earlier
commands wrote. The commands are read from README.md, as .ci/run reads the test command.

Left out, and why: the install steps (`python3 -m venv ... && .venv/bin/pip install ...`: this test
runs in the installed environment), so `.venv/bin/rpg-train` runs as `rpg-train`; the notebooks'
`jupyter lab` (a server that runs until it is stopped). Nothing is shortened, so the test takes as
long as the tour (`slow`): 25 min on a 2-core x86-64 machine at load average 20-45 (other
jobs); -rP prints each command's time."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from needs import needs_data

README = Path(__file__).resolve().parent.parent / "README.md"
SERVERS = ("jupyter lab",)  # commands that run until stopped
LOOKS_LIKE_AN_ERROR = re.compile(r"Traceback|Exception|Error\b|error:|Warning|WARNING")


def _section(text: str, title: str) -> str:
    body = text.split(f"\n{title}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def _bash_lines(section: str) -> list:
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _without_install(line: str) -> str:
    """The line's commands after its install steps, `.venv/bin/X` as X ('' if nothing is left)."""
    parts = [p.strip() for p in line.split("&&")]
    kept = [p for p in parts if not p.startswith("python3 -m venv") and "pip install" not in p]
    return " && ".join(p.removeprefix(".venv/bin/") for p in kept)


def tour_commands(text: str) -> tuple[list, list]:
    """(commands to run in order, commands left out): the quick start's first command, then the
    tour's."""
    first = _without_install(_bash_lines(_section(text, "## Quick start"))[0])
    run, left_out = [first], []
    for line in _bash_lines(_section(text, "## A short tour")):
        command = _without_install(line)
        if command.startswith(SERVERS):
            left_out.append(command)
        elif command:
            run.append(command)
    return run, left_out


def test_the_tour_is_read_from_the_readme():
    """The quick start's run comes first, the tour's commands follow in README order, and only the
    notebooks' server is left out."""
    run, left_out = tour_commands(README.read_text())
    assert run[0] == "rpg-train" and left_out == ["jupyter lab notebooks/"], (run, left_out)
    assert any(c.startswith("rpg-plot ") for c in run) and len(run) >= 8, run


@pytest.mark.slow
@needs_data()
def test_every_tour_command_runs_in_order(tmp_path):
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")]))
    commands, _ = tour_commands(README.read_text())
    for command in commands:
        t0 = time.monotonic()
        r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=1800)
        print(f"{time.monotonic() - t0:6.0f} s  {command}", file=sys.stderr)  # shown with -rP
        output = r.stdout + r.stderr
        assert r.returncode == 0, f"{command}: exit code {r.returncode}\n{output[-3000:]}"
        bad = [line for line in output.splitlines() if LOOKS_LIKE_AN_ERROR.search(line)]
        assert not bad, f"{command} printed:\n" + "\n".join(bad[:20])
    # the chain: the resumed run went on to 120 steps; rpg-plot drew the runs it was given
    steps = [json.loads(x)["step"] for x in (tmp_path / "runs/grpo/metrics.jsonl").open()]
    assert steps == list(range(1, 121))
    assert (tmp_path / "runs/compare.png").stat().st_size > 0
