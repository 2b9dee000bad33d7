"""Run a library's own functions from its installed files without importing its package.

The peers' loss modules import their whole training stack at the top (ray, deepspeed, hydra, vLLM,
flash-attn): irrelevant to the loss and not installable next to each other. ``load_defs`` reads the
module file of the installed distribution (pinned version), takes the named top-level definitions
(functions with their decorators, classes, constants; ``Class.method`` for a method) and executes
exactly those, with the names they use supplied by the caller. Nothing is copied: the code that
runs is the installed file's.
"""

from __future__ import annotations
import __future__

import ast
from importlib import metadata


class PeerMissing(Exception):
    """The distribution is not installed at the pinned version."""


def installed_file(dist: str, version: str, relpath: str):
    try:
        found = metadata.version(dist)
    except metadata.PackageNotFoundError:
        raise PeerMissing(
            f"{dist} is not installed (pip install --no-deps {dist}=={version})"
        ) from None
    if found != version:
        raise PeerMissing(f"{dist} {found} is installed; the adapter is pinned to {version}")
    path = metadata.distribution(dist).locate_file(relpath)
    if not path.is_file():
        raise PeerMissing(f"{dist} {version}: {relpath} not found")
    return path


def load_defs(dist: str, version: str, relpath: str, names: list[str], env: dict) -> dict:
    """Execute the named definitions of ``relpath`` in a namespace built from ``env``; return it."""
    path = installed_file(dist, version, relpath)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    top = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top[node.name] = node
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            top[node.targets[0].id] = node
    picked = []
    for name in names:
        cls, _, meth = name.partition(".")
        if cls not in top:
            raise PeerMissing(f"{dist} {version}: {relpath} has no {cls}")
        node = top[cls]
        if meth:
            node = next(
                (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == meth), None
            )
            if node is None:
                raise PeerMissing(f"{dist} {version}: {relpath} has no {name}")
        picked.append(node)
    code = compile(ast.Module(body=picked, type_ignores=[]), str(path), "exec",
                   # annotations unevaluated
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    ns = dict(env)
    exec(code, ns)  # the installed library's own definitions
    return ns
