"""Results rows made by hand as the study runner writes them (small_scale/study/runner.py): a
test's outcomes, with the record the runner keeps beside them."""

import small_scale.study.files as S


def as_run(spec: dict, row: dict) -> dict:
    """``row`` with what the runner records beside its outcomes: the command the study file gives
    its cell and seed, the file's sha256, a series and a summary (empty)."""
    return {"series": [], "summary": {}, **row, "study_sha256": spec["sha256"],
            "argv": [*S.COMMAND, *S.planned_argv(spec, row["cell"], row["seed"], None), "--out",
                     "x", "--cache-dir", "y", *S.RUNNER_FLAGS]}
