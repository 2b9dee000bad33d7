"""The small rpg-train and rpg-eval runs that several test files use, as argument lists: a test
passes only the settings it changes, as keywords (math_eval_n=0 -> --math-eval-n 0; True -> the bare
flag, False -> --no-<flag>, a tuple -> several values, None -> the flag left out).

    tiny_math_argv(model, out, **settings)   --task math on a tiny Qwen3 (model: a config.json),
                                             2 AMC23 problems x 2 responses of 4 tokens, 2 steps
    small_seq_argv(**settings)               --task seq, 4 prompts x 4 responses
    tiny_eval_argv(model, out, **settings)   rpg-eval of ``model`` (an HF folder) on 2 AMC23
                                             problems x 2 responses, normalizer checks, into ``out``
    sigint_as_in_a_terminal                  preexec_fn of a child that a test sends Ctrl-C

Standard library only: tests/test_vllm_real.py imports it in the vLLM venv.
"""

from __future__ import annotations

import signal

TINY_MATH = {
    "task": "math",
    "math_train_data": "amc23",
    "math_eval_data": "aime24",
    "math_eval_limit": 2,
    "math_eval_n": 2,
    "math_eval_k": (1, 2),
    "math_checker": "normalizer",
    "steps": 2,
    "prompts_per_step": 2,
    "group_size": 2,
    "mini_batch_size": 2,
    "max_new_tokens": 4,
    "overlong_buffer": 0,
    "dynamic_sampling": False,
    "device": "cpu",
    "progress": False,
    # the `math` preset's bf16 autocast + checkpointing are for GPUs (tested separately)
    "math_dtype": "float32",
    "math_gradient_checkpointing": False,
    "micro_batch_size": 0,
    # 2 shared cores: one thread is several times faster for this tiny model
    "threads": 1,
}

TINY_EVAL = {
    "data": "amc23",
    "limit": 2,
    "n": 2,
    "k": (1, 2),
    "backend": "normalizer",
}

SMALL_SEQ = {
    "task": "seq",
    "prompts_per_step": 4,
    "group_size": 4,
    "mini_batch_size": 8,
    "seq_eval_size": 16,
}


def argv_of(settings: dict) -> list[str]:
    """A command's arguments for {option: value}, in the dict's order (see the module's doc)."""
    argv = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, (tuple, list)):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def tiny_math_argv(model, out, **settings) -> list[str]:
    """The tiny math run of ``model`` (a Qwen3 config.json or checkpoint) into ``out``."""
    return argv_of({**TINY_MATH, "math_model": str(model), "out": str(out), **settings})


def small_seq_argv(**settings) -> list[str]:
    """The small seq run (no --out: give it, or a test's parse_config call adds it)."""
    return argv_of({**SMALL_SEQ, **settings})


def tiny_eval_argv(model, out, **settings) -> list[str]:
    """The tiny rpg-eval run of ``model`` (an HF checkpoint folder), its results in ``out``."""
    return argv_of({"model": str(model), **TINY_EVAL, **settings, "out": str(out)})


def sigint_as_in_a_terminal() -> None:
    """SIGINT as a terminal's process has it, for a child that a test sends Ctrl-C: a suite started
    in the background runs with SIGINT ignored, which its children inherit (and Python then keeps
    ignoring), so the signal would never reach them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
