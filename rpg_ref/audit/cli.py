"""rpg-audit's command line: the built-in adapters, or the user's own loss and objectives.

    rpg-audit [--only NAME ...]           built-in adapters (rpg-ref, peers installed here)
    rpg-audit --loss my_loss.py:fn [--beta B] [--level token|sequence] [--objective f.py:D ...]
              [--vocab V] [--horizons H ...] [--seed S] [--off-step X] [--ref-step X]
              [--logit-scale X] [--max-ratio W] [--markdown FILE] [--json FILE]

``--loss`` takes PATH.py:NAME or package.module:NAME, a function
``fn(logp, old_logp, ref_logp, advantages, mask) -> scalar`` ([B, H] tensors, advantages [B]); if it
accepts ``beta=`` or ``level=`` keywords, --beta and --level are passed to it. ``--objective`` takes
a function ``D(logp, old_logp, ref_logp) -> scalar`` of the [N, H] token log-probs of EVERY response
(logp differentiable): an extra candidate objective.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import inspect
import json
import math
import sys
import time
from pathlib import Path

import torch

from rpg_ref.audit.adapter import BETA, Adapter
from rpg_ref.audit.core import (
    HORIZONS,
    LossFailed,
    Policies,
    changed_in_place,
    mutation_advice,
)
from rpg_ref.audit.report import LEGEND, LEGEND_MORE, format_table, to_markdown
from rpg_ref.audit.run import audit


class UserError(Exception):
    """A mistake in the command line, reported as one line."""


def load_object(spec: str, flag: str):
    """PATH.py:NAME or package.module:NAME -> the object."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise UserError(f"{flag} {spec}: expected PATH.py:NAME or package.module:NAME")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise UserError(f"{flag} {spec}: file {where} does not exist")
            mod_spec = importlib.util.spec_from_file_location(f"rpg_audit_user_{path.stem}", path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.path.insert(0, str(path.resolve().parent))              # its own sibling imports
            try:
                mod_spec.loader.exec_module(module)
            finally:
                sys.path.pop(0)
        else:
            module = importlib.import_module(where)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 -- any failure of the user's module is reported in one line
        raise UserError(
            f"{flag} {spec}: importing {where} failed: {type(e).__name__}: {e}"
        ) from None
    if not hasattr(module, name):
        raise UserError(f"{flag} {spec}: {where} has no attribute {name!r}")
    obj = getattr(module, name)
    if not callable(obj):
        raise UserError(f"{flag} {spec}: {name} is not callable")
    return obj


def _keywords(fn) -> set[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def user_adapter(spec: str, beta: float, level: str) -> Adapter:
    fn = load_object(spec, "--loss")
    kw = {k: v for k, v in (("beta", beta), ("level", level)) if k in _keywords(fn)}
    loss = functools.partial(fn, **kw) if kw else fn
    # one call on a tiny batch before any work: a wrong signature or result is named here
    B, H = 2, 2
    logp = torch.full((B, H), -1.0, dtype=torch.float64, requires_grad=True)
    inputs = (logp, logp.detach() - 0.1, logp.detach() - 0.2,
              torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(B, H, dtype=torch.float64))
    before = tuple(t.detach().clone() for t in inputs)
    try:
        out = loss(*inputs)
    except Exception as e:  # noqa: BLE001
        raise UserError(
            f"--loss {spec}: calling it as fn(logp, old_logp, ref_logp, advantages, mask) on a "
            f"[{B}, {H}] batch raised {type(e).__name__}: {e}"
        ) from None
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        raise UserError(
            f"--loss {spec}: must return a scalar tensor, got "
            f"{type(out).__name__}{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}"
        )
    if not bool(torch.isfinite(out.detach()).all()):
        raise UserError(f"--loss {spec}: returned {float(out.detach())} on a finite [{B}, {H}] "
                        f"batch")
    if changed := changed_in_place(before, inputs):
        raise UserError(f"--loss {spec}: changed {' and '.join(changed)} in place on a [{B}, {H}] "
                        f"batch: {mutation_advice(changed)}")
    name = spec.rpartition(":")[2]
    return Adapter(name, loss, beta, "user", True, level, f"--loss {spec}")


def user_objective(spec: str):
    fn = load_object(spec, "--objective")
    logp = torch.full((3, 1), math.log(1 / 3), dtype=torch.float64, requires_grad=True)
    try:
        out = fn(logp, logp.detach(), logp.detach())
    except Exception as e:  # noqa: BLE001
        raise UserError(
            f"--objective {spec}: calling it as D(logp, old_logp, ref_logp) on [3, 1] log-probs "
            f"raised {type(e).__name__}: {e}"
        ) from None
    if not isinstance(out, torch.Tensor) or out.numel() != 1 or not out.requires_grad:
        raise UserError(f"--objective {spec}: must return a scalar tensor differentiable in logp")
    return spec.rpartition(":")[2], fn


def _bad_output(path: str | None, flag: str) -> str | None:
    if path is not None and not Path(path).resolve().parent.is_dir():
        return f"{flag} {path}: directory {Path(path).parent} does not exist"
    return None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rpg-audit",
        description="Which objective does a loss's exact expected gradient follow? (docs/audit.md)",
    )
    ap.add_argument("--loss", action="append", metavar="PATH.py:NAME", help="audit this function "
                    "fn(logp, old_logp, ref_logp, advantages, mask) -> scalar (repeatable); or "
                    "package.module:NAME")
    ap.add_argument(
        "--beta", type=float, default=BETA, help=f"the KL coefficient of --loss (default {BETA})"
    )
    ap.add_argument("--level", default="token", choices=("token", "sequence"),
                    help="label of --loss, passed as level= if it takes it (default token)")
    ap.add_argument(
        "--objective",
        action="append",
        metavar="PATH.py:NAME",
        default=[],
        help="an extra candidate D(logp, old_logp, ref_logp) over every response (repeatable)",
    )
    ap.add_argument(
        "--only", nargs="+", metavar="NAME", help="built-in adapters whose name contains NAME"
    )
    ap.add_argument("--vocab", type=int, default=3, help="vocabulary size V, 2..8 (default 3)")
    ap.add_argument("--horizons", nargs="+", type=int, default=list(HORIZONS), metavar="H",
                    help="response lengths (V^H responses each; default 1 2 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random policies (default 0)")
    ap.add_argument(
        "--off-step", type=float, default=0.5, help="off-policy θ = θ_old + X·N(0,1) (default 0.5)"
    )
    ap.add_argument(
        "--ref-step", type=float, default=0.8, help="θ_ref = θ_old + X·N(0,1) (default 0.8)"
    )
    ap.add_argument("--logit-scale", type=float, default=1.0, help="θ_old = X·N(0,1) (default 1)")
    ap.add_argument(
        "--max-ratio",
        type=float,
        default=None,
        metavar="W",
        help="off-policy: scale θ - θ_old so the largest per-token π_θ/π_old is W (clamps bind)",
    )
    ap.add_argument("--no-fit", action="store_true", help="skip the combination fit")
    ap.add_argument("--markdown", metavar="FILE", help="write the table as markdown")
    ap.add_argument(
        "--json", metavar="FILE", help="write every row (per horizon, errors, gradients) as JSON"
    )
    ap.add_argument("--list", action="store_true", help="list the built-in adapters and exit")
    return ap


def check_args(args, policies: Policies) -> list[str]:
    errors = [
        policies.check(),
        _bad_output(args.markdown, "--markdown"),
        _bad_output(args.json, "--json"),
    ]
    states = [policies.vocab ** h for h in args.horizons]
    if any(h < 1 for h in args.horizons) or (not errors[0] and max(states) > 4096):
        errors.insert(
            0,
            f"--horizons must be >= 1 with V^H <= 4096 responses, got {args.horizons} at "
            f"V={args.vocab}",
        )
    if args.seed < 0:
        errors.insert(0, f"--seed must be >= 0, got {args.seed}")
    if not (math.isfinite(args.beta) and args.beta > 0):
        errors.insert(0, f"--beta must be a finite number > 0, got {args.beta}")
    return [e for e in errors if e]


class Ticker:
    """Prints the stage the audit is at to stderr, at most every EVERY seconds and only once the
    audit has run that long: a slow loss shows where it is, a fast one prints nothing."""

    EVERY = 5.0

    def __init__(self):
        self.start = self.last = time.monotonic()

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if now - self.last >= self.EVERY:
            self.last = now
            print(f"rpg-audit: {text}; {now - self.start:.0f} s so far", file=sys.stderr,
                  flush=True)


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    policies = Policies(args.vocab, args.off_step, args.ref_step, args.logit_scale, args.max_ratio)
    for err in check_args(args, policies):
        ap.exit(2, f"rpg-audit: error: {err}\n")
    try:
        objectives = dict(user_objective(s) for s in args.objective)
        flags = {}  # id(adapter) -> "--loss SPEC": how a message names the user's loss
        if args.loss:
            adapters, notes = [user_adapter(s, args.beta, args.level) for s in args.loss], []
            flags = {id(a): f"--loss {s}" for a, s in zip(adapters, args.loss)}
        else:
            from rpg_ref.audit.adapters import all_adapters
            adapters, notes = all_adapters()
        if args.only:
            adapters = [a for a in adapters if any(s in a.name for s in args.only)]
            if not adapters:
                raise UserError(f"no adapter name contains any of {args.only}; see --list")
    except UserError as e:
        ap.exit(2, f"rpg-audit: error: {e}\n")
    if args.list:
        print("\n".join(f"{a.name} [{a.level}] ({a.code})" for a in adapters))
        return 0
    torch.set_num_threads(1)                   # tiny tensors: more threads only add synchronization
    try:
        rows = audit(adapters, tuple(sorted(set(args.horizons))), args.seed, policies, objectives,
                     fit=not args.no_fit, progress=Ticker())
    except LossFailed as e:  # raised, or not a finite scalar, on one of the audit's batches
        who = flags.get(id(e.adapter), e.adapter.name)
        ap.exit(2, f"rpg-audit: error: {who} {e.detail}\n")
    except ValueError as e:  # a loss the audit cannot judge, or unreachable --max-ratio
        ap.exit(2, f"rpg-audit: error: {e}\n")
    except Exception as e:                     # the user's own code failing mid-audit
        if not args.loss:
            raise
        ap.exit(2, f"rpg-audit: error: --loss raised {type(e).__name__} during the audit: {e}\n")
    print(format_table(rows))
    print("\n" + LEGEND + "\n" + LEGEND_MORE)
    for n in notes:
        print(f"note: {n}")
    if args.markdown:
        Path(args.markdown).write_text(to_markdown(rows), encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0
