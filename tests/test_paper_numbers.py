"""The paper's numbers beside its LaTeX labels (derivations/paper_numbers.py): LaTeX's counter
rules on a small document numbered by hand, the committed table against the paper's .tex (where
the paper is), a few numbers as the paper's PDF prints them, and every "<Kind> <number> (<label>)"
citation in the repository against the table."""

import re
from pathlib import Path

import pytest

from derivations import paper_numbers as PN
from derivations.paper_tables import paper_tex_path

ROOT = Path(__file__).resolve().parents[1]

SMALL = r"""
\documentclass{article}
\usepackage{amsthm}
\newtheorem{theorem}{Theorem}[section]
\newtheorem{lemma}[theorem]{Lemma}
\newtheorem{remark}{Remark}
\numberwithin{equation}{section}
\begin{document}
\section{Intro}\label{sec:intro}
\begin{theorem}\label{thm:a} x \end{theorem}
\begin{lemma}\label{lem:b} y \end{lemma}
\begin{remark}\label{rem:c} z \end{remark}
\begin{align}
a &= b \label{eq:first} \\
c &= d \nonumber \\
e &= f \label{eq:second} \\
\end{align}
\begin{table}\caption{T}\label{tab:one}\end{table}
\subsection{Part}\label{sec:part}
% \label{commented:out}
\begin{equation}\label{eq:third} g \end{equation}
\section*{Unnumbered}\label{sec:star}
\section{Second}
\begin{lemma}\label{lem:d} \end{lemma}
\begin{remark}\label{rem:e} \end{remark}
\begin{figure}\subfigure[p]{\label{fig:panel}}\caption{F}\label{fig:whole}\end{figure}
\begin{table}\label{tab:before_caption}\caption{U}\end{table}
\appendix
\section{Proofs}\label{app:proofs}
\begin{theorem}\label{thm:f}\end{theorem}
\begin{equation}\label{eq:app} h \end{equation}
\begin{algorithm}\caption{A}\label{alg:one}\end{algorithm}
\end{document}
"""


def test_latex_counter_rules_on_a_small_document():
    """Shared counters within sections (theorem/lemma), a separate global one (remark), equation
    rows numbered within sections with \\nonumber skipped and a trailing \\\\ not counted, floats
    numbered throughout, panels as 2(a), a label before its caption naming the section, appendix
    letters, \\section* numbering nothing, comments ignored. Expected numbers worked out by hand."""
    got = {k: v for k, (v, _) in PN.number_labels(SMALL).items()}
    assert got == {
        "sec:intro": "Section 1", "thm:a": "Theorem 1.1", "lem:b": "Lemma 1.2", "rem:c": "Remark 1",
        "eq:first": "Eq. (1.1)", "eq:second": "Eq. (1.2)", "tab:one": "Table 1",
        "sec:part": "Section 1.1", "eq:third": "Eq. (1.3)",
        "lem:d": "Lemma 2.1", "rem:e": "Remark 2",
        "fig:panel": "Figure 1(a)", "fig:whole": "Figure 1",
        "tab:before_caption": "Section 2", "app:proofs": "Appendix A", "thm:f": "Theorem A.1",
        "eq:app": "Eq. (A.1)", "alg:one": "Algorithm 1"}


def test_committed_table_is_the_papers_numbering():
    """derivations/paper_numbers.txt is what number_labels derives from rpg_paper.tex today."""
    tex = paper_tex_path()
    if not tex.is_file():
        pytest.skip(f"the paper's .tex is not here ({tex}; set RPG_PAPER_TEX): the committed table "
                    f"is used as is")
    assert PN.render(PN.number_labels(tex.read_text())) == PN.NUMBERS_FILE.read_text()


def test_numbers_as_the_pdf_prints_them():
    """A few numbers read off the paper's PDF (its headings and references): shared theorem
    counter within sections (Definition 3.1, Proposition 3.2, Remark 3.3, ..., Proposition 3.6),
    appendix letters, equations within sections, global tables and algorithms."""
    table = PN.load()
    assert {label: table[label] for label in (
        "thm:generalized_policy_gradient_theorem", "prop:policy_gradient_unormalized_forward_kl",
        "remark:ufkl_interpretation", "remark:k3_connection_main",
        "prop:policy_gradient_unormalized_reverse_kl", "prop:equiv_rf_fd",
        "prop:policy_gradient_forward_kl", "prop:policy_gradient_reverse_kl",
        "prop:offpolicy_reinforce_loss_fkl", "prop:offpolicy_reinforce_loss_urkl",
        "tab:off-policy-loss-normalized", "alg:offpolicy_rpg_rf_ppo_dualclip_v1",
        "sec:related_work", "proof:ufkl")} == {
        "thm:generalized_policy_gradient_theorem": "Proposition 2.1",
        "prop:policy_gradient_unormalized_forward_kl": "Proposition 3.2",
        "remark:ufkl_interpretation": "Remark 3.3", "remark:k3_connection_main": "Remark 3.5",
        "prop:policy_gradient_unormalized_reverse_kl": "Proposition 3.6",
        "prop:equiv_rf_fd": "Proposition 4.1", "prop:policy_gradient_forward_kl": "Proposition E.1",
        "prop:policy_gradient_reverse_kl": "Proposition E.3",
        "prop:offpolicy_reinforce_loss_fkl": "Proposition F.1",
        "prop:offpolicy_reinforce_loss_urkl": "Proposition F.5",
        "tab:off-policy-loss-normalized": "Table 4",
        "alg:offpolicy_rpg_rf_ppo_dualclip_v1": "Algorithm 2",
        "sec:related_work": "Appendix A", "proof:ufkl": "Appendix K.2"}


CITATION = re.compile(r"\b(Proposition|Theorem|Definition|Remark|Table|Algorithm|Figure|Section|"
                      r"Appendix|Eq\.)\s+(\(?[A-Z0-9][\w.()]*?\)?)\s+\(`?([a-z]+:[A-Za-z0-9_\-]+)`?\)")


def test_every_citation_in_the_repository_has_the_papers_number():
    """Each "<Kind> <number> (<label>)" in the code and docs carries the number the table gives
    that label (a renumbered paper, or a typo, fails here)."""
    table = PN.load()
    files = [p for pattern in ("rpg_ref/**/*.py", "derivations/**/*.py", "derivations/*.md",
                               "docs/*.md", "README.md", "small_scale/**/*.py",
                               "paper_figs/**/*.py", "notebooks/*.py")
             for p in ROOT.glob(pattern)]
    seen, wrong = 0, []
    for path in files:
        for m in CITATION.finditer(path.read_text()):
            kind, number, label = m.groups()
            if label not in table:
                continue
            seen += 1
            if table[label] != f"{kind} {number}":
                wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)!r}, the paper has "
                             f"{table[label]}")
    assert not wrong, "\n".join(wrong)
    assert seen >= 20, (
        f"only {seen} citations found: does the pattern still match the code's style?"
    )
