"""The learning path (docs/start_here.md, docs/learn/): each chapter has the paper's arXiv link,
exercises with included solutions, code included from real functions, Python checks that run,
and links that resolve."""

import ast
import contextlib
import io
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEARN = ROOT / "docs" / "learn"
CHAPTERS = sorted(LEARN.glob("0[1-9]_*.md"))
PAGES = [ROOT / "docs" / "start_here.md", LEARN / "index.md", *CHAPTERS]
ARXIV = "https://arxiv.org/abs/2505.17508"
INCLUDE = re.compile(r"```\{literalinclude\} (\S+)\n:pyobject: (\S+)\n```")


def test_eight_chapters_in_the_index():
    assert len(CHAPTERS) == 8
    index = (LEARN / "index.md").read_text(encoding="utf-8")
    for ch in CHAPTERS:
        assert f"\n{ch.stem}\n" in index, ch.name


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_has_the_paper_code_check_and_exercises_with_solutions(chapter):
    text = chapter.read_text(encoding="utf-8")
    assert ARXIV in text
    headings = ["## Pseudocode", "## The code that runs it", "## Check it yourself", "## Exercises"]
    if chapter.stem < "07":                 # 7 and 8: experiments and costs, no derivation
        headings.append("## The math")
    for heading in headings:
        assert heading in text, heading
    exercises = text.split("## Exercises", 1)[1]
    solutions = re.findall(r"````\{admonition\} Solution\n:class: dropdown\n(.*?)````", exercises,
                           re.S)
    assert 2 <= len(solutions) <= 3
    for s in solutions:
        assert "exercises/" in s and "tests/test_exercises.py::" in s


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.stem)
def test_included_code_is_a_real_function(page):
    text = page.read_text(encoding="utf-8")
    found = INCLUDE.findall(text)
    assert found
    for path, name in found:
        source = (page.parent / path).resolve()
        assert source.is_file(), path
        tree = ast.parse(source.read_text(encoding="utf-8"))
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert name in names, (path, name)


def test_named_exercise_tests_exist():
    tests = (ROOT / "tests" / "test_exercises.py").read_text(encoding="utf-8")
    for ch in CHAPTERS:
        for name in re.findall(r"tests/test_exercises\.py::(\w+)", ch.read_text(encoding="utf-8")):
            assert f"def {name}(" in tests, (ch.name, name)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_relative_links_resolve(page):
    prose = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", prose):
        if target.startswith(("http://", "https://")):
            continue
        assert (page.parent / target).exists(), (page.name, target)


CHECK = re.compile(r"```python\n(.*?)```\n(?:\nIt prints:\n\n```text\n(.*?)```)?", re.S)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_python_checks_run_and_print_what_the_page_says(chapter):
    cwd = os.getcwd()
    os.chdir(ROOT)                                    # the checks run from the repository root
    try:
        for code, printed in CHECK.findall(chapter.read_text(encoding="utf-8")):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, chapter.name, "exec"), {"__name__": "__check__"})
            if printed:
                assert out.getvalue() == printed
    finally:
        os.chdir(cwd)


NUMBERS = ROOT / "derivations" / "paper_numbers.txt"
CITED = re.compile(r"\b(Proposition|Prop\.|Remark|Table|Algorithm|Figure|Section|Appendix)s?\s+"
                   r"([A-K](?:\.\d+)?|\d+(?:\.\d+)?)\b|\bEq\.\s+\(([A-K]?\.?\d+(?:\.\d+)?)\)")


def test_every_paper_number_cited_is_one_the_paper_prints():
    printed = {line.split("\t")[1] for line in NUMBERS.read_text(encoding="utf-8").splitlines()
               if line and not line.startswith("#")}
    seen, wrong = 0, []
    for page in PAGES:
        for kind, number, eq in CITED.findall(page.read_text(encoding="utf-8")):
            kind = "Proposition" if kind == "Prop." else kind
            cited = f"Eq. ({eq})" if eq else f"{kind} {number}"
            seen += 1
            if cited not in printed:
                wrong.append(f"{page.name}: {cited}")
    assert not wrong, wrong
    assert seen >= 40
