"""The audit's rows as text: verdict phrases, the console table and the markdown table."""

from __future__ import annotations

from rpg_ref.audit.core import LABELS, MATCH_TOL, ZERO_NORM, Setting


def label(key: str) -> str:
    sign, base = ("-", key[1:]) if key.startswith("-") else ("", key)
    return sign + (base.removeprefix("user:") if base.startswith("user:") else LABELS[base])


def describe(matches: list[str]) -> str:
    """Matched candidates as one phrase; U and normalized KL merge as (U)KL, sequence = token as '=
    Σt'."""
    parts = []
    for sign in ("", "-"):
        for d, arrow in (("rkl", "π‖ref"), ("fkl", "ref‖π")):
            seq = [u for u in ("", "u") if f"{sign}seq-{u}{d}" in matches]
            tok = f"{sign}tok-{d}" in matches
            name = {2: "(U)KL", 1: "UKL" if seq == ["u"] else "KL", 0: ""}[len(seq)]
            if seq:
                parts.append(f"{sign}{name}({arrow})" + (" = Σt" if tok else ""))
            elif tok:
                parts.append(f"{sign}Σt KL({arrow})")
        parts += [label(k) for k in matches if k.startswith(f"{sign}user:")]
    if "no-kl" in matches:
        parts.append("0 (no KL)")
    return "; ".join(parts)


def _coef(c: float, first: bool) -> str:
    sign = "-" if c < 0 else ("" if first else "+")
    mag = abs(c)
    body = "" if abs(mag - 1) < 1e-6 else f"{mag:.4g}·"
    return f"{sign}{body}" if first else f" {sign} {body}"


def describe_combination(terms: dict[str, float]) -> str:
    """{'seq-rkl': 1, 'tok-fkl': -1} -> 'KL(π‖ref) - Σt KL(ref‖π)'."""
    return "".join(_coef(c, i == 0) + label(k) for i, (k, c) in enumerate(terms.items()))


def precision_note(row: dict) -> str:
    """Said only where the verdict needed the loss's lower precision (nothing held to 1e-10). The
    error itself is left out: at float32 it is rounding, which differs between CPUs (the rows'
    kl_match_err and kl_combination hold it)."""
    return "" if row.get("kl_judged_at", MATCH_TOL) <= MATCH_TOL else \
        f" at {row['precision']} precision"


def kl_cell(row: dict) -> str:
    if row["kl_all_zero"] and row["kl_grad_norm"] < ZERO_NORM:
        return "0 (every D: 0)"
    if row["kl_matches"]:
        return describe(row["kl_matches"]) + precision_note(row)
    combo = row.get("kl_combination")
    if combo:
        return (
            f"{describe_combination(combo['terms'])} (same coefficients on {combo['draws']} draws)"
            + precision_note(row)
        )
    low = (
        "" if row.get("precision", "float64") == "float64" else f"; computed in {row['precision']}"
    )
    if row["kl_all_zero"]:
        # every candidate is 0 but the KL part is not: no candidate is closer than another
        return f"none (every D: 0, ‖g‖ = {row['kl_grad_norm']:.2g}{low})"
    return f"none (closest {describe(row['kl_closest'])}: {row['kl_closest_err']:.2g}{low})"


def reward_cell(rows: list[dict]) -> str:
    if all(r["reward_exact"] for r in rows):
        return "exact"
    return " / ".join("exact" if r["reward_exact"] else f"{r['reward_rel_err']:.2g}" for r in rows)


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and lines: one line per loss x (theta, pi_ref) setting, the horizons side by side."""
    hs = sorted({r["horizon"] for r in rows})
    head = ["loss", "level", "code", "θ", "π_ref", f"reward part (H={'/'.join(map(str, hs))})"]
    head += [f"KL part, H={h}" for h in hs]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(
            (r["loss"], r["level"], r["code"], r["on_policy"], r["ref_is_old"]), []
        ).append(r)
    lines = []
    for (name, level, code, on, ref_old), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["horizon"])
        s = Setting(on, ref_old)
        lines.append(
            [name, level, code, s.theta, s.ref, reward_cell(rs)] + [kl_cell(r) for r in rs]
        )
    return head, lines


def format_table(rows: list[dict]) -> str:
    head, lines = table(rows)
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    out = [" | ".join(c.ljust(w) for c, w in zip(x, widths)) for x in [head, *lines]]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


# the legends are printed as they stand (the committed tables hold them): lines of any length
LEGEND = """\
Reward part: relative error of g(A=R) - g(A=0) against -∇E[R] (sequence level); "exact" = within 1e-10.
KL part: the D for which the loss's expected gradient at A=0 equals β∇D, i.e. the loss follows E[R] - β·D.
(U)KL = KL and UKL give the same gradient (both are normalized here); "= Σt": the sequence divergence and the
per-position sum coincide in this setting; "-D": the loss raises D (it follows E[R] + β·D); "none": no candidate
within 1e-10, closest candidate (with every candidate of the same gradient, named as above) and
||g - t|| / max(||g||, ||t||, 1e-4); "0 (every D: 0)": the KL gradient and every candidate's vanish (θ = θ_old,
π_ref = π_old)."""  # noqa: E501

LEGEND_MORE = """\
"a·D1 + b·D2 (same coefficients on K draws)": no single D matches, but this one combination does on K independent
draws of the policies (many more equations than unknowns). "at float32 precision": the loss computes in float32
and matched within 100 eps of its precision (1.2e-5), not within 1e-10."""  # noqa: E501


def to_markdown(rows: list[dict]) -> str:
    head, lines = table(rows)
    esc = lambda c: c.replace("|", "\\|")
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(esc(c) for c in x) + " |" for x in lines]
    return LEGEND + "\n" + LEGEND_MORE + "\n\n" + "\n".join(md) + "\n"
