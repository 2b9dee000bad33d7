"""The import rules of docs/architecture.md hold: every module of rpg_ref/ sits in one room of its
table, and imports (at the top or inside a function) only its own room and the rooms that the
table's "may import" column names. Inside trainer/, every module sits in one layer of the doc's
second table and imports only its own layer and the layers below, with no circle, and never from
inside a function."""

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rpg_ref"
DOC = ROOT / "docs" / "architecture.md"


def rooms() -> dict:
    """{room: (paths under rpg_ref/, rooms it may import or None for any)} from the doc's table."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("| room | files |"))
    out = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, files, _job, may = (c.strip() for c in line.strip("|").split("|"))
        allowed = (
            None
            if may == "any"
            else {r.strip() for r in may.split(",") if r.strip() not in ("—", "")}
        )
        out[name] = (re.findall(r"`([^`]+)`", files), allowed)
    return out


def room_of(module: Path, table: dict) -> str | None:
    rel = module.relative_to(PACKAGE).as_posix()
    for name, (paths, _) in table.items():
        if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in paths):
            return name
    return None


def absolute_imports(path: Path):
    """(module, names) of every absolute import in ``path``, those inside functions too:
    ``import a.b`` gives ("a.b", []), ``from a import b, c`` gives ("a", ["b", "c"])."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]


def module_file(name: str) -> Path | None:
    """The file of module ``name`` in this repository (a .py or a package's __init__.py)."""
    base = ROOT.joinpath(*name.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


def imported_modules(path: Path) -> set:
    """Every rpg_ref module that ``path`` imports, as a file of the package."""
    out = set()
    for module, names in absolute_imports(path):
        for name in (module, *(f"{module}.{n}" for n in names)):
            # the package itself: imported by every import of it
            if name.startswith("rpg_ref.") and (f := module_file(name)):
                out.add(f)
    return out


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_room_table_names_real_files_and_rooms():
    """Every path in the table exists, and every room a row may import is a row of the table."""
    table = rooms()
    assert {"contracts", "core", "trainer", "tasks", "engines", "math", "audit"} <= set(table)
    for name, (paths, allowed) in table.items():
        for p in paths:
            assert (PACKAGE / p).exists(), f"room {name}: rpg_ref/{p} does not exist"
        assert allowed is None or allowed <= set(table), f"room {name} may import unknown rooms"


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_every_import_follows_the_room_rules(module):
    table = rooms()
    room = room_of(module, table)
    assert room is not None, (f"rpg_ref/{module.relative_to(PACKAGE).as_posix()} is in no room of "
                              f"docs/architecture.md: add it to the table")
    allowed = table[room][1]
    if allowed is None:
        return
    bad = []
    for target in imported_modules(module):
        other = room_of(target, table)
        if other != room and other not in allowed:
            bad.append(f"{target.relative_to(PACKAGE).as_posix()} ({other})")
    assert not bad, f"{room} may import {sorted(allowed) or 'nothing else'}, but imports {bad}"


def test_the_checker_sees_lazy_and_from_imports(tmp_path):
    """The import reader finds an import inside a function and a `from rpg_ref import x` of a
    module, so a rule cannot pass because an import hides in a function body."""
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from rpg_ref.trainer import train\n"
                 "    import rpg_ref.math.reward\n")
    want = {PACKAGE / "trainer" / "__init__.py", PACKAGE / "trainer" / "train.py",
            PACKAGE / "math" / "reward.py"}
    assert imported_modules(f) == want


def test_package_uses_full_module_paths():
    """Every `rpg_ref.<...>` module that a file of the package imports is a file or folder of the
    package, and every name imported from `rpg_ref` itself is one of its modules: an import
    through an alias (`rpg_ref.losses` for `rpg_ref.core.losses`) names no file, so it would
    escape the room rules above."""
    bad = []
    for path in MODULES:
        for module, names in absolute_imports(path):
            if module.split(".")[0] != "rpg_ref":
                continue
            if not module_file(module):
                bad.append(f"{path.relative_to(ROOT)}: {module}")
            if module == "rpg_ref":
                bad += [f"{path.relative_to(ROOT)}: rpg_ref.{n}" for n in names
                        if n != "__version__" and not module_file(f"rpg_ref.{n}")]
    assert not bad, bad


# ------------------------------------------------------------------------------------------
# inside trainer/: the layers
# ------------------------------------------------------------------------------------------

TRAINER = PACKAGE / "trainer"
TRAINER_MODULES = sorted(TRAINER.rglob("*.py"))


def layers() -> dict:
    """{module path: layer number} from the doc's layer table (paths under rpg_ref/trainer/; a
    folder takes its files)."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("| layer | modules |"))
    paths = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        number, files, _job = (c.strip() for c in line.strip("|").split("|"))
        paths[int(number.split()[0])] = re.findall(r"`([^`]+)`", files)
    out = {}
    for number, names in paths.items():
        for name in names:
            found = ([TRAINER / name] if not name.endswith("/")
                     else sorted((TRAINER / name).rglob("*.py")))
            out.update(dict.fromkeys(found, number))
    return out


def trainer_imports(module: Path) -> set:
    return {t for t in imported_modules(module) if TRAINER in t.parents}


def layer_violations(imports: dict, layer: dict) -> list[str]:
    """Each import of a module ({module: modules it imports}) from a higher layer than its own."""
    rel = lambda p: p.relative_to(TRAINER).as_posix()
    return [f"{rel(m)} (layer {layer[m]}) imports {rel(t)} (layer {layer[t]})"
            for m, targets in imports.items() for t in sorted(targets) if layer[t] > layer[m]]


def circles(imports: dict) -> list:
    """An import circle among the modules ({module: modules it imports}), or []."""
    try:
        TopologicalSorter(imports).prepare()
    except CycleError as e:
        return e.args[1]
    return []


def test_every_trainer_module_is_in_one_layer():
    table = layers()
    missing = [p.relative_to(TRAINER).as_posix() for p in TRAINER_MODULES if p not in table]
    assert not missing, f"rpg_ref/trainer/ modules in no layer of docs/architecture.md: {missing}"
    assert all(p.exists() for p in table), "the layer table names a file that does not exist"


def test_trainer_imports_only_its_own_layer_and_below_with_no_circle():
    table = layers()
    imports = {m: trainer_imports(m) for m in TRAINER_MODULES}
    assert layer_violations(imports, table) == []
    assert circles(imports) == []


def test_the_layer_rule_fails_on_a_lower_module_importing_a_higher_one(tmp_path):
    """The checks above can fail: a bottom module (errors.py) that imports the loop, at the top or
    inside a function, is reported, and so is a circle."""
    table = layers()
    for body in ("from rpg_ref.trainer.train import train\n",
                 "def f():\n    from rpg_ref.trainer import train\n"):
        fake = tmp_path / "errors.py"
        fake.write_text(body)
        imports = {TRAINER / "errors.py": trainer_imports(fake)}
        assert layer_violations(imports, table) == [
            f"errors.py (layer {table[TRAINER / 'errors.py']}) imports train.py "
            f"(layer {table[TRAINER / 'train.py']})"]
    a, b = TRAINER / "checkpoint.py", TRAINER / "metrics.py"
    assert set(circles({a: {b}, b: {a}})) == {a, b}


def test_no_trainer_module_imports_rpg_ref_inside_a_function():
    """Every import of rpg_ref in trainer/ (and in rpg-train's cli.py) is at the module's top: an
    import inside a function is how a circle hides."""
    bad = []
    for path in [*TRAINER_MODULES, PACKAGE / "cli.py"]:
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                             else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    bad += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                            if n.split(".")[0] == "rpg_ref"]
    assert not bad, bad
