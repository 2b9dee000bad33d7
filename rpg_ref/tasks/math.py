"""The ``math`` task of rpg-train: a chat model learns to answer competition math problems.

    rpg-train --task math --math-model Qwen/Qwen3-0.6B --engine hf ...        (any GPU, or CPU)
    rpg-train --preset qwen3-4b-h100 --engine vllm                              (the paper's run)

What it plugs into the trainer (the Task protocol of rpg_ref.interfaces):

  prompts   a training problem through the model's chat template with the paper's instruction
            ("... The last line of your response should be of the form Answer: $Answer ...") or the
            \\boxed{} variant (--math-prompt), Qwen3's thinking switch (--math-enable-thinking);
            rpg_ref.math.reward.chat_prompt_ids. Problems come from rpg_ref.math.data.load_problems
            (a set name such as deepmath_int, a .jsonl/.parquet file, or hf:<dataset id>). Each call
            of sample_prompts draws distinct problems uniformly at random from the trainer's prompt
            generator (so a resumed run draws the same problems as an uninterrupted one).
  reward    the decoded response's final answer checked against the gold answer
            (rpg_ref.math.reward: math-verify when installed, else the documented normalizer; a
            per-answer time limit), +1 / -1 (--math-scoring pm1, the paper's) or 1 / 0 (binary).
            DAPO's soft overlong punishment is the trainer's --overlong-buffer / --overlong-penalty,
            added by the loop for every task (rpg_ref.trainer.shaping.overlong_penalty).
            accuracy = fraction of responses whose answer is verified correct.
  evaluate  Mean@k and Pass@k (rpg_ref.math.evaluation.evaluate_sets) per evaluation set, with
            --math-eval-n samples per problem, every --eval-every steps and at the end; logged in
            metrics.jsonl as eval_<set>_mean@<k>, eval_<set>_pass@<k>, eval_<set>_response_len,
            eval_<set>_cap_hits (share of responses without EOS) and, with --math-prompt number,
            eval_<set>_strict (share that are the bare right number).
            Evaluation samples from its own seeded random stream, so evaluating (or not) never
            changes training.
  policy    a Hugging Face causal LM: a checkpoint folder or hub id (pretrained weights), or a
            config.json (file, or a folder holding only one) for a randomly initialized model
            (tests, benchmarks). It is wrapped in rpg_ref.models.HFPolicy, which adds the precision
            choice and gradient checkpointing that the memory budget needs
            (docs/memory_budget_qwen3_4b_h100.md) without any change to the training loop.
  finish    at the end of a run the final policy is saved as a plain Hugging Face checkpoint with
            its tokenizer in OUT/hf (what rpg-eval --model and vLLM load; --math-export), and the
            answer-checker workers stop; any trainer checkpoint can be exported with
            ``python -m rpg_ref.export OUT [DEST]``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from rpg_ref.interfaces import Prompt
from rpg_ref.math.data import data_dir, load_problems
from rpg_ref.math.tiny_model import TINY_MODEL, tiny_qwen3_config
from rpg_ref.models.gguf import PACKAGED, hf_folder, is_gguf_spec
from rpg_ref.models.hub import check_model_source
from rpg_ref.models.load import export_model, load_hf_model, load_tokenizer, resolve_tokenizer
from rpg_ref.models.policy import DTYPES, HFPolicy


def model_source(spec: str, cache_dir: str) -> str:
    """--math-model as the loaders take it: TINY_MODEL becomes CACHE_DIR/tiny-qwen3/config.json
    (rewritten when the shared config changes), a GGUF file or a packaged model's short name its
    converted folder in CACHE_DIR (rpg_ref.models.gguf), anything else is returned as it is."""
    if is_gguf_spec(spec):
        return _flagged("--math-model", spec, hf_folder, spec, cache_dir)
    if spec != TINY_MODEL:
        return spec
    shared = data_dir() / "models" / "qwen3-0.6b" / "config.json"
    if not shared.is_file():
        raise ValueError(
            f"--math-model {spec} is built from Qwen3-0.6B's config {shared}, which is "
            f"absent: set RPG_DATA_DIR to the shared data folder (models/, tokenizer/)"
        )
    path = Path(cache_dir) / TINY_MODEL / "config.json"
    text = json.dumps(tiny_qwen3_config(), indent=1)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)  # a concurrent reader sees the old file or the new one, whole
    return str(path)


def _flagged(flag: str, value, fn, *args, **kwargs):
    """fn(*args, **kwargs), its ValueError prefixed by the flag (and the value, unless named)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}" if str(value) in str(e) else f"{flag} {value}: {e}") from e


def freeze_below(model: nn.Module, n: int) -> None:
    """Only the last ``n`` decoder layers and the final norm keep requires_grad (the optimizer skips
    parameters without a gradient): a cheaper step, and the embedding (tied to the LM head in small
    models) stays the base model's."""
    body = getattr(model, "model", None)
    layers, norm = getattr(body, "layers", None), getattr(body, "norm", None)
    if not isinstance(layers, nn.ModuleList) or norm is None:
        raise ValueError(f"--math-train-layers: {type(model).__name__} has no model.layers and "
                         f"model.norm to train alone; use --math-train-layers 0")
    if n > len(layers):
        raise ValueError(f"--math-train-layers {n}: the model has {len(layers)} decoder layers")
    model.requires_grad_(False)
    for module in (*layers[len(layers) - n:], norm):
        module.requires_grad_(True)


# =============================================================================================
# the task
# =============================================================================================


class MathTask:
    """The Task protocol for math reasoning (module docstring)."""

    name = "math"
    default_engine = "hf"
    evaluation = "held-out"

    @dataclass
    class Options:
        model: str = field(
            default="Qwen/Qwen3-4B",
            metadata={
                "help": "policy: a Hugging Face "
                "checkpoint folder or hub id, a GGUF file, a packaged model "
                f"({', '.join(PACKAGED)}: the smollm2 extra), or a config.json (file or "
                "weightless folder) for a randomly initialized model, or "
                f"{TINY_MODEL!r} (Qwen3-0.6B's shared config shrunk to 2 layers of width 64, "
                "random: for CPUs)"
            },
        )
        tokenizer: str = field(default="", metadata={"help": "tokenizer folder or hub id ('' = the "
                               "model's own; the shared Qwen3 tokenizer for a bare config)"})
        dtype: str = field(
            default="float32",
            metadata={
                "help": f"one of {DTYPES}: fp32; fp32 master "
                "weights with bf16 autocast compute; or bf16 weights (loses tiny updates)"
            },
        )
        gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute decoder "
                                             "layer activations in the backward pass"})
        train_layers: int = field(default=0, metadata={"help": "train only the last N decoder "
                                  "layers and the final norm (0 = every parameter); the "
                                  "embedding and LM head are then frozen"})
        attn_implementation: str = field(default="sdpa", metadata={"help": "HF attention kernel "
                                         "(sdpa, eager, flash_attention_2)"})
        train_data: str = field(
            default="deepmath_int",
            metadata={
                "help": "training problems: a set "
                "name, a .jsonl/.parquet file or hf:<dataset id> (rows with an empty "
                "answer are dropped)"
            },
        )
        train_split: str = field(default="train", metadata={"help": "split of an hf: training set"})
        train_limit: int = field(
            default=0, metadata={"help": "use the first N training problems (0 = all)"}
        )
        answer_field: str = field(
            default="answer",
            metadata={
                "help": "training data's field holding "
                "the gold answer (dotted for nested, e.g. reward_model.ground_truth)"
            },
        )
        problem_field: str = field(default="problem", metadata={"help": "training data's field "
                                   "holding the problem text"})
        max_prompt_tokens: int = field(
            default=2048,
            metadata={
                "help": "drop training problems whose "
                "prompt is longer (counted in summary.json; 0 = keep all)"
            },
        )
        prompt: str = field(default="answer", metadata={"help": "'answer': the paper's 'Answer: "
                            "$Answer' instruction; 'boxed': the \\boxed{} variant; 'number': "
                            "'Answer with just the number.', scored on the number after the last "
                            "'=' (arithmetic sets arith:KIND:SPLIT)"})
        enable_thinking: bool = field(default=False, metadata={"help": "Qwen3 chat template's "
                                      "thinking mode (off: an empty <think></think> block)"})
        scoring: str = field(default="pm1", metadata={"help": "'pm1': +1 correct / -1 otherwise "
                             "(the paper's); 'binary': 1 / 0"})
        checker: str = field(default="auto", metadata={"help": "answer checker: auto (math-verify "
                             "when installed), math_verify or normalizer"})
        check_timeout: float = field(default=5.0, metadata={"help": "seconds per answer check (a "
                                     "timeout scores the answer wrong)"})
        check_workers: int = field(default=1, metadata={"help": "answer-checker processes"})
        eval_data: list[str] = field(default_factory=lambda: ["aime24", "aime25", "amc23"],
                                     metadata={"help": "evaluation sets (names, files or hf: ids)"})
        eval_limit: int = field(
            default=0, metadata={"help": "first N problems of each eval set (0 = all)"}
        )
        eval_n: int = field(
            default=32, metadata={"help": "samples per eval problem (0 = no evaluation)"}
        )
        eval_k: list[int] = field(default_factory=lambda: [32], metadata={"help": "k of Mean@k and "
                                  "Pass@k (each <= eval_n)"})
        eval_temperature: float = field(default=1.0, metadata={"help": "eval sampling temperature "
                                        "(0 = greedy, needs eval_n 1)"})
        eval_top_p: float = field(default=1.0, metadata={"help": "eval nucleus threshold"})
        eval_max_new_tokens: int = field(default=0, metadata={"help": "eval response length (0 = "
                                         "--max-new-tokens)"})
        export: bool = field(default=True, metadata={"help": "save the final policy as a Hugging "
                             "Face checkpoint with its tokenizer in OUT/hf"})

        def __post_init__(self):
            from rpg_ref.math.reward import SCORINGS, STYLES  # here: the reward imports sympy

            def bad(msg):
                raise ValueError(f"bad math option: {msg}")

            for flag, valid in (("prompt", STYLES), ("scoring", SCORINGS), ("dtype", DTYPES)):
                if getattr(self, flag) not in valid:
                    bad(f"--math-{flag} must be one of {valid}, got {getattr(self, flag)!r}")
            for flag in ("train_limit", "eval_limit", "max_prompt_tokens", "eval_n",
                         "eval_max_new_tokens", "train_layers"):
                if getattr(self, flag) < 0:
                    bad(f"--math-{flag.replace('_', '-')} must be >= 0, got {getattr(self, flag)}")
            if not 0 < self.check_timeout < math.inf or self.check_workers < 1:
                bad(f"need --math-check-timeout finite and > 0 and --math-check-workers >= 1, got "
                    f"{self.check_timeout}, {self.check_workers}")
            if not self.eval_n:
                return
            if not self.eval_data:
                bad("--math-eval-data is empty (use --math-eval-n 0 for no evaluation)")
            if not self.eval_k or not all(1 <= k <= self.eval_n for k in self.eval_k):
                bad(f"--math-eval-k values must be in [1, --math-eval-n {self.eval_n}], got "
                    f"{self.eval_k}")
            if not 0 <= self.eval_temperature < math.inf or not 0 < self.eval_top_p <= 1:
                bad(f"need --math-eval-temperature finite and >= 0 and 0 < --math-eval-top-p <= 1, "
                    f"got {self.eval_temperature}, {self.eval_top_p}")
            if self.eval_temperature == 0 and self.eval_n > 1:
                bad("--math-eval-temperature 0 (greedy) gives identical samples: use "
                    "--math-eval-n 1")

    def __init__(self, cfg, device: torch.device):
        o = self.opt = self.Options(**cfg.task_options)
        self.cfg, self.device = cfg, device
        # here, not at the top: rpg-train imports every task to list its flags, and the reward
        # imports sympy
        from rpg_ref.math.reward import MathReward, chat_prompt_ids

        # every input is checked before anything slow: the data files, then the model's source
        fields = {"problem": o.problem_field, "answer": o.answer_field}
        probs = _flagged("--math-train-data", o.train_data, load_problems, o.train_data,
                         split=o.train_split, fields=fields, limit=o.train_limit or None,
                         drop_empty_answers=True)
        self.eval_sets = {}
        for spec in o.eval_data if o.eval_n else ():
            ps = _flagged("--math-eval-data", spec, load_problems, spec, limit=o.eval_limit or None)
            name = spec[3:] if spec.startswith("hf:") else ps[0].source
            if name in self.eval_sets:
                raise ValueError(f"--math-eval-data: two sets are named {name!r}")
            self.eval_sets[name] = ps
        self.model_spec = model_source(o.model, cfg.cache_dir)
        check_model_source(self.model_spec, "--math-model")
        shared = data_dir() / "tokenizer" / "qwen3"  # for a bare config.json
        self.tokenizer_path = o.tokenizer or _flagged("--math-model", o.model, resolve_tokenizer,
                                                      self.model_spec, shared)
        if self.tokenizer_path != self.model_spec:  # the model's own tokenizer was checked above
            check_model_source(self.tokenizer_path, "--math-tokenizer")
        self.tokenizer = _flagged("--math-tokenizer", self.tokenizer_path, load_tokenizer,
                                  self.tokenizer_path)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {self.tokenizer_path} has no eos token")
        self.eos_id = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_id

        # training prompts, tokenized once (long prompts dropped and counted)
        ids = [
            chat_prompt_ids(self.tokenizer, p.problem, o.prompt, o.enable_thinking) for p in probs
        ]
        keep = [
            i for i, x in enumerate(ids) if not o.max_prompt_tokens or len(x) <= o.max_prompt_tokens
        ]
        self.dropped_long = len(probs) - len(keep)
        self.train = [(probs[i], ids[i]) for i in keep]
        if len(self.train) < cfg.prompts_per_step:
            raise ValueError(f"--math-train-data {o.train_data}: {len(self.train)} usable problems "
                             f"({self.dropped_long} dropped as longer than {o.max_prompt_tokens} "
                             f"prompt tokens) < --prompts-per-step {cfg.prompts_per_step}")
        self.scorer = MathReward(style=o.prompt, scoring=o.scoring, backend=o.checker,
                                 timeout_s=o.check_timeout, num_workers=o.check_workers,
                                 thinking=o.enable_thinking)

    # --- Task protocol -------------------------------------------------------------------------
    def build_policy(self) -> nn.Module:
        o = self.opt
        model = _flagged("--math-model", o.model, load_hf_model, self.model_spec, o.dtype,
                         o.attn_implementation, self.device)
        n_vocab = model.get_input_embeddings().weight.shape[0]
        if len(self.tokenizer) > n_vocab:
            raise ValueError(
                f"tokenizer {self.tokenizer_path} has {len(self.tokenizer)} tokens but the "
                f"model's embedding has only {n_vocab} rows"
            )
        if o.train_layers:
            freeze_below(model, o.train_layers)
        return HFPolicy(model, o.dtype, o.gradient_checkpointing)

    def sample_prompts(self, n: int, gen: torch.Generator):
        idx = torch.randperm(len(self.train), generator=gen)[:n].tolist()  # n distinct problems
        return [Prompt(ids=list(self.train[i][1]), answer=self.train[i][0].answer) for i in idx]

    def reward(self, prompts, responses):
        """(+1 / -1 or 1 / 0 [N], verified-correct [N]) for the decoded responses."""
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        rewards, info = self.scorer(texts, [p.answer for p in prompts])
        return (torch.tensor(rewards, dtype=torch.float32, device=self.device),
                torch.tensor(info["correct"], dtype=torch.bool, device=self.device))

    def evaluate(self, policy, engine) -> dict:
        """Mean@k / Pass@k per eval set; samples come from a fixed seed, not the training stream."""
        from rpg_ref.math.evaluation import evaluate_sets

        o = self.opt
        if not o.eval_n:
            return {}
        max_new = o.eval_max_new_tokens or self.cfg.max_new_tokens

        def generate_fn(prompts, n):
            return engine.generate(prompts, n, o.eval_temperature, o.eval_top_p, max_new).responses

        devices = [self.device] if torch.device(self.device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg.seed + 1_000_003)
            results, _ = evaluate_sets(
                generate_fn,
                self.tokenizer,
                self.eval_sets,
                o.eval_n,
                o.eval_k,
                o.prompt,
                o.enable_thinking,
                self.scorer.checker,
            )
        out = {}
        for name, r in results.items():
            for k in o.eval_k:
                out[f"{name}_mean@{k}"] = r[f"mean@{k}"]
                out[f"{name}_pass@{k}"] = r[f"pass@{k}"]
            out[f"{name}_response_len"] = r["mean_response_tokens"]
            out[f"{name}_cap_hits"] = r["cap_hits"]
            if "strict" in r:
                out[f"{name}_strict"] = r["strict"]
        return out

    def summary(self, policy, cfg) -> dict:
        return {
            "hf_export": str(Path(cfg.out) / "hf") if self.opt.export else None,
            "train_problems": len(self.train),
            "train_problems_dropped_long_prompt": self.dropped_long,
            "answer_checks": self.scorer.checker.stats.as_dict(),
            **({"note": self.random_model_note(cfg)} if self.opt.model == TINY_MODEL else {}),
        }

    def random_model_note(self, cfg) -> str:
        """Why a run of the random tiny model ends with the lowest reward and accuracy 0 (rpg-train
        prints it under its final line)."""
        wrong = -1.0 if self.opt.scoring == "pm1" else 0.0
        penalty = cfg.overlong_penalty if cfg.overlong_buffer else 0.0
        parts = f"a wrong answer {wrong:g}" + (f", overlong {-penalty:g}" if penalty else "")
        return (f"--math-model {TINY_MODEL} is a random 2-layer model: it cannot solve math (its "
                f"text holds no answer and never ends), so reward {wrong - penalty:g} ({parts}) "
                f"and accuracy 0 are what it gets; this run checks the pipeline, not the learning")

    def finish(self, policy, out: Path) -> None:
        """The final policy as an HF checkpoint with its tokenizer in OUT/hf (policy None: a rank
        of a torchrun run other than rank 0, which writes nothing); the workers stop."""
        if self.opt.export and policy is not None:
            export_model(policy, self.tokenizer, Path(out) / "hf")
        self.close()

    def close(self) -> None:
        self.scorer.close()


if __name__ == "__main__":
    # `python -m rpg_ref.tasks.math export OUT [DEST]`, the export command's first spelling, runs
    # `python -m rpg_ref.export OUT [DEST]` (the export is a face: no task imports it)
    import runpy
    import sys

    if sys.argv[1:2] != ["export"]:
        sys.exit("usage: python -m rpg_ref.export OUT [DEST]   (also: python -m rpg_ref.tasks.math "
                 "export OUT [DEST])")
    sys.argv = ["python -m rpg_ref.export", *sys.argv[2:]]
    runpy.run_module("rpg_ref.export", run_name="__main__", alter_sys=True)
