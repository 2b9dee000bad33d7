"""docs/design_space.md: the committed page is what the audit computes now, and the library code
audited here gets the verdicts of the cell the page puts it in."""

from pathlib import Path

import pytest

from rpg_ref.audit.adapters import docs_adapters, rpg_ref_adapters
from rpg_ref.audit.core import Setting
from rpg_ref.audit.design_space import CELL, COLUMNS, LIBRARY, audit_cells, main, render, verdicts
from rpg_ref.audit.run import audit

PAGE = Path(__file__).resolve().parents[1] / "docs" / "design_space.md"
ON_REF = Setting(on_policy=True, ref_is_old=False)


@pytest.fixture(scope="module")
def cells():
    return audit_cells()


def test_committed_page_is_current(cells):
    assert PAGE.read_text(encoding="utf-8") == render(cells), (
        "docs/design_space.md is stale: python -m rpg_ref.audit.design_space --write "
        "docs/design_space.md")


def test_library_code_gets_its_cells_verdicts(cells):
    by_name = {(a.name, a.level): a for a in rpg_ref_adapters() + docs_adapters()}
    checked = [(cell, by_name[key]) for _, _, cell, key, _ in LIBRARY if key is not None]
    assert len(checked) >= 15
    got = verdicts(audit([a for _, a in checked], fit=True))
    for cell, a in checked:
        settings = COLUMNS if CELL[cell].place == "loss" else [ON_REF]
        for s in settings:
            assert got[(a.name, a.level, s)] == cells[(cell, s)], (a.name, s)


def test_known_verdicts_of_the_literature(cells):
    # on-policy with a fixed reference: k1 as a loss has no expected gradient, k3 as a loss pulls
    # the forward KL, k3 times w the reverse KL (Tang & Munos 2025; the RPG paper, Section 2.2)
    assert cells[("k1 in the loss, no w, token", ON_REF)] == "0 (no KL)"
    assert "KL(ref‖π)" in cells[("k3 in the loss, no w, token", ON_REF)]
    assert "KL(π‖ref)" in cells[("k3 in the loss, w, token", ON_REF)]
    assert "ref‖π" not in cells[("k3 in the loss, w, token", ON_REF)]
    # k1 in the reward with return to go: the whole responses' KL(π‖ref) at every horizon
    assert cells[("k1 in the reward, w, token", ON_REF)].endswith("H ≥ 2: (U)KL(π‖ref)")


def test_check_names_a_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--check", str(tmp_path / "nope.md")])
    assert e.value.code == 2
    assert "no such file" in capsys.readouterr().err
