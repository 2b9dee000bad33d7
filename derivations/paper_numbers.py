"""The numbers a reader of the paper's PDF sees beside each LaTeX label ("Proposition 3.2" for
prop:policy_gradient_unormalized_forward_kl), derived from rpg_paper.tex by LaTeX's own rules.

The code cites the paper as ``Proposition 3.2 (prop:policy_gradient_unormalized_forward_kl)``:
the number for a reader of the PDF, the label for a search in the .tex. ``number_labels(tex)``
walks the source in order, stepping the counters LaTeX steps:
  * sections: 1, 2, ...; after \\appendix A, B, ...; \\section* steps nothing;
  * theorem-like environments: as the preamble's \\newtheorem lines declare them. The paper takes
    its own from smile.sty, which is not part of its source: SMILE_THEOREMS states them as the
    paper's PDF shows them (one counter shared by all, within sections: Definition 3.1,
    Proposition 3.2, Remark 3.3);
  * equations: within sections where the preamble (or smile.sty) says so, else throughout; one
    number per row of a display that has no \\nonumber / \\notag;
  * tables, figures (their panels as 2(a)), algorithms: throughout the document, at their \\caption.
A \\label names the last thing numbered before it in its group (LaTeX's \\@currentlabel: an
environment is a group, so after \\end{...} the label is the one from before its \\begin).

NUMBERS_FILE (derivations/paper_numbers.txt, "label<TAB>number") is the committed result, so that
the numbers are known where the .tex is not; tests/test_paper_numbers.py regenerates it from the
.tex when the paper is there, and holds every "<Kind> <number> (<label>)" citation in the
repository against it. Regenerate:
    python -m derivations.paper_numbers > derivations/paper_numbers.txt
"""

from __future__ import annotations

import re
import string
import sys
from pathlib import Path

from derivations.paper_tables import blank_comments, paper_tex_path

NUMBERS_FILE = Path(__file__).with_name("paper_numbers.txt")

# smile.sty's declarations, as the PDF numbers them: every kind steps one counter, reset by \section
SMILE_THEOREMS = {env: ("theorem", env.capitalize(), True) for env in (
    "theorem", "proposition", "lemma", "corollary", "definition", "remark", "assumption",
    "example", "claim", "condition", "conjecture", "fact", "hypothesis", "question")}
SMILE_EQUATION_WITHIN_SECTION = True

DISPLAYS = ("equation", "align", "gather", "multline", "flalign", "alignat")
FLOATS = {"table": "Table", "figure": "Figure", "algorithm": "Algorithm"}

TOKEN = re.compile(
    r"\\(?P<sec>(?:sub){0,2}section)(?P<star>\*?)(?![a-zA-Z])"
    r"|\\(?P<appendix>appendix)(?![a-zA-Z])"
    r"|\\begin\{(?P<begin>[A-Za-z*]+)\}"
    r"|\\end\{(?P<end>[A-Za-z*]+)\}"
    r"|\\(?P<caption>caption)(?![a-zA-Z])"
    r"|\\(?P<subfig>subfigure|subfloat)(?![a-zA-Z*])"
    r"|\\label\{(?P<label>[^}]*)\}"
    r"|\\(?P<nonumber>nonumber|notag)(?![a-zA-Z])"
    r"|(?P<newline>\\\\)")
NEWTHEOREM = re.compile(r"\\newtheorem\{(\w+)\}(?:\[(\w+)\])?\{([^}]*)\}(?:\[(\w+)\])?")


def theorem_kinds(preamble: str) -> tuple[dict, bool]:
    """({env: (counter, printed name, numbered within sections)}, equations numbered within
    sections) from the preamble's \\newtheorem and \\numberwithin lines; smile.sty's when the paper
    loads it and declares none."""
    kinds = {}
    for env, shared, name, within in NEWTHEOREM.findall(preamble):
        if shared:                                       # numbered like the counter it shares
            kinds[env] = (shared, name, kinds[shared][2])
        else:
            kinds[env] = (env, name, within == "section")
    within = bool(re.search(r"\\(numberwithin|counterwithin)\{equation\}\{section\}", preamble))
    if re.search(r"\\usepackage(\[[^]]*\])?\{[^}]*\bsmile\b", preamble):
        kinds = {**SMILE_THEOREMS, **kinds}
        within = within or SMILE_EQUATION_WITHIN_SECTION
    return kinds, within


def number_labels(tex: str) -> dict[str, tuple[str, int]]:
    """{label: (its number as the PDF prints it, e.g. "Proposition 3.2", line of the label)}."""
    text = blank_comments(tex)
    begin_doc = text.index("\\begin{document}")
    kinds, eq_within = theorem_kinds(text[:begin_doc])
    sec, appendix = [0, 0, 0], False
    counters = {"equation": 0, "table": 0, "figure": 0, "algorithm": 0, "subfigure": 0}
    counters.update({c: 0 for c, _, _ in kinds.values()})
    current = ("", "")                                   # LaTeX's \@currentlabel
    stack: list[tuple[str, tuple]] = []                  # open environments, the label before each
    row = {"labels": [], "numbered": True, "start": 0}   # the display row being read
    out: dict[str, tuple[str, int]] = {}

    def line(pos):
        return tex.count("\n", 0, pos) + 1

    def section_number(depth=1):
        first = string.ascii_uppercase[sec[0] - 1] if appendix else str(sec[0])
        return ".".join([first, *map(str, sec[1:depth])])

    def end_row(pos, last=False):
        nonlocal current
        blank = not text[row["start"]:pos].strip()
        if row["numbered"] and not (last and blank and not row["labels"]):
            counters["equation"] += 1
            n = counters["equation"]
            current = ("Eq.", f"({section_number()}.{n})" if eq_within else f"({n})")
        for label, at in row["labels"]:
            out[label] = (f"{current[0]} {current[1]}", line(at))
        row.update(labels=[], numbered=True, start=pos)

    for m in TOKEN.finditer(text, begin_doc):
        envs = [e for e, _ in stack]
        pos, display = m.start(), bool(envs) and envs[-1] in DISPLAYS
        if m["sec"] and m["star"]:
            current = ("", "")                           # unnumbered: its label has no number
        elif m["sec"]:
            depth = m["sec"].count("sub") + 1
            sec[depth - 1] += 1
            sec[depth:] = [0] * (3 - depth)
            if depth == 1:
                counters.update({c: 0 for c, _, within in kinds.values() if within})
                counters["equation"] = 0 if eq_within else counters["equation"]
            current = ("Appendix" if appendix else "Section", section_number(depth))
        elif m["appendix"]:
            appendix, sec = True, [0, 0, 0]
        elif m["begin"]:
            env = m["begin"]
            stack.append((env, current))
            if env in kinds:
                counter, name, within = kinds[env]
                counters[counter] += 1
                n = counters[counter]
                current = (name, f"{section_number()}.{n}" if within else str(n))
            elif env in DISPLAYS:
                row.update(labels=[], numbered=True, start=m.end())
            elif env == "figure":
                counters["subfigure"] = 0
        elif m["end"]:
            if m["end"] in DISPLAYS and display:
                end_row(pos, last=True)
            if stack and stack[-1][0] == m["end"]:
                current = stack.pop()[1]                 # an environment is a group
        elif m["subfig"] or (m["caption"] and "subfigure" in envs):
            counters["subfigure"] += 1                   # a panel of the figure being built
            letter = string.ascii_lowercase[counters["subfigure"] - 1]
            current = ("Figure", f"{counters['figure'] + 1}({letter})")
        elif m["caption"]:
            float_env = next((e for e in reversed(envs) if e in FLOATS), None)
            if float_env:
                counters[float_env] += 1
                current = (FLOATS[float_env], str(counters[float_env]))
        elif m["label"]:
            if display:
                row["labels"].append((m["label"], pos))
            elif current[0]:
                out[m["label"]] = (f"{current[0]} {current[1]}", line(pos))
        elif m["nonumber"] and display:
            row["numbered"] = False
        elif m["newline"] and display:
            end_row(m.end())
    return out


def cite(label: str) -> str:
    """"Proposition 3.2 (prop:policy_gradient_unormalized_forward_kl)": number, then label."""
    return f"{load()[label]} ({label})"


def load(path: Path = NUMBERS_FILE) -> dict[str, str]:
    """The committed {label: number} table."""
    rows = (ln.split("\t") for ln in path.read_text().splitlines() if ln and not ln.startswith("#"))
    return dict(rows)


def render(numbers: dict[str, tuple[str, int]]) -> str:
    head = ("# The paper's numbers beside its LaTeX labels, in the order of rpg_paper.tex;\n"
            "# generated by derivations/paper_numbers.py (python -m derivations.paper_numbers).\n")
    return head + "".join(f"{label}\t{num}\n" for label, (num, _) in
                          sorted(numbers.items(), key=lambda kv: kv[1][1]))


if __name__ == "__main__":
    path = paper_tex_path()
    if not path.is_file():
        sys.exit(f"paper_numbers: {path} not found; set RPG_PAPER_TEX to the paper's .tex")
    sys.stdout.write(render(number_labels(path.read_text())))
