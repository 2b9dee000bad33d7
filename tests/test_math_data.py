"""Loading math problem sets: the shared eval/train files, JSONL/parquet, clear errors on bad
files."""
import builtins
import json
import sys

import pytest
from needs import needs_data

from rpg_ref.math import data as md


def _need_data():
    if not (md.data_dir() / "eval").is_dir():
        pytest.skip(f"{md.data_dir()} has no eval/: set RPG_DATA_DIR to the shared data folder")


@needs_data("eval")
def test_shared_sets_load_with_their_row_counts_and_answer_types():
    _need_data()
    counts = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500}
    for name, n in counts.items():
        ps = md.load_problems(name)
        assert len(ps) == n and len({p.id for p in ps}) == n
    assert all(isinstance(p.answer, float) for p in md.load_problems("amc23"))
    assert md.load_problems("aime24")[7].answer == "025"  # zero padding kept verbatim
    assert len(md.load_problems("math_train", drop_empty_answers=True)) == 7498
    with pytest.raises(ValueError, match=r"math_train\.jsonl:5342: field 'answer' is empty"):
        md.load_problems("math_train")


def test_rpg_data_dir_overrides_the_default(tmp_path, monkeypatch):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "aime24.jsonl").write_text(
        json.dumps({"problem": "p", "answer": "1"}) + "\n"
    )
    monkeypatch.setenv("RPG_DATA_DIR", str(tmp_path))
    assert md.data_dir() == tmp_path
    ps = md.load_problems("aime24")
    assert [(p.id, p.problem, p.answer) for p in ps] == [("aime24-0", "p", "1")]
    monkeypatch.setenv("RPG_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="RPG_DATA_DIR"):
        md.load_problems("aime25")


@pytest.mark.parametrize("layout", ["clone", "installed"])
def test_default_data_dir_in_a_clone_and_in_an_installed_package(tmp_path, monkeypatch, layout):
    """Without RPG_DATA_DIR: in a clone (its root holds pyproject.toml) the folder beside the
    clone, ../shared/data; installed (site-packages holds no pyproject.toml) the user's data folder
    $XDG_DATA_HOME/rpg-ref/data, not a path inside the environment."""
    import importlib.util
    import shutil

    root = tmp_path / "root"
    (root / "rpg_ref" / "math").mkdir(parents=True)
    path = shutil.copy(md.__file__, root / "rpg_ref" / "math" / "data.py")
    if layout == "clone":
        (root / "pyproject.toml").write_text("")
    spec = importlib.util.spec_from_file_location("data_copy", path)
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "data_copy", copy)  # its dataclass looks itself up there
    spec.loader.exec_module(copy)
    monkeypatch.delenv("RPG_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    expected = {"clone": tmp_path / "shared" / "data", "installed": tmp_path / "xdg" / "rpg-ref"
                / "data"}[layout]
    assert copy.data_dir() == expected


@pytest.mark.parametrize(
    "line,message",
    [
        ('{"problem": "p"}', r"bad\.jsonl:2: missing field 'answer'"),
        (
            '{"problem": "", "answer": "1"}',
            r"bad\.jsonl:2: field 'problem' must be a non-empty string",
        ),
        (
            '{"problem": "p", "answer": [1]}',
            r"bad\.jsonl:2: field 'answer' must be a string or a number",
        ),
        (
            '{"problem": "p", "answer": true}',
            r"bad\.jsonl:2: field 'answer' must be a string or a number",
        ),
        ('{"problem": "p", "answer": NaN}', r"bad\.jsonl:2: field 'answer' is not finite"),
        ('{"problem": "p", "answer": "1"', r"bad\.jsonl:2: invalid JSON at column 31 \(Expecting "
                                           r"',' delimiter\)$"),
        # a raw tab inside a string: json's own message stops at "... character at"
        ('{"problem": "p\tq", "answer": "1"}',
         r"bad\.jsonl:2: invalid JSON at column 15 \(Invalid control character\)$"),
        ('{"problem": "p', r"bad\.jsonl:2: invalid JSON at column 13 \(Unterminated string\)$"),
        ("[1, 2]", r"bad\.jsonl:2: expected a JSON object"),
        ('{"id": "a", "problem": "q", "answer": "2"}', r"bad\.jsonl:2: duplicate id 'a'"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, line, message):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "a", "problem": "p", "answer": "1"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        md.load_problems(str(f))


def test_unknown_files_and_types_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        md.load_problems(str(tmp_path / "missing.jsonl"))
    f = tmp_path / "x.csv"
    f.write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        md.load_problems(str(f))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no problems"):
        md.load_problems(str(empty))


def test_parquet_and_nested_field_names(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    table = pa.Table.from_pylist([
        {"prompt": "1+1?", "reward_model": {"ground_truth": "2"}, "uid": "u0"},
        {"prompt": "2+2?", "reward_model": {"ground_truth": "4"}, "uid": "u1"},
    ])
    f = tmp_path / "d.parquet"
    pq.write_table(table, f)
    ps = md.load_problems(
        str(f), fields={"problem": "prompt", "answer": "reward_model.ground_truth", "id": "uid"}
    )
    assert [(p.id, p.problem, p.answer, p.source) for p in ps] == [
        ("u0", "1+1?", "2", "d"),
        ("u1", "2+2?", "4", "d"),
    ]
    with pytest.raises(ValueError, match=r"d\.parquet row 0: missing field 'problem'"):
        md.load_problems(str(f))
    with pytest.raises(ValueError, match="fields may only rename"):
        md.load_problems(str(f), fields={"solution": "x"})


def test_hugging_face_id_without_datasets_gives_a_clear_error(monkeypatch):
    real_import = builtins.__import__

    def no_datasets(name, *a, **k):
        if name == "datasets":
            raise ImportError("no datasets here")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(ValueError, match="needs the `datasets` package"):
        md.load_problems("hf:HuggingFaceH4/MATH-500", split="test")
