"""The ``math`` task of rpg-train: a chat model learns to answer competition math problems.

    rpg-train --task math --math-model Qwen/Qwen3-0.6B --engine hf ...        (any GPU, or CPU)
    rpg-train --preset qwen3-4b-h100 --engine vllm                              (the paper's run)

What it plugs into the trainer (the Task protocol of rpg_ref.interfaces):

  prompts   a training problem through the model's chat template with the paper's instruction
            ("... The last line of your response should be of the form Answer: $Answer ...") or the
            \\boxed{} variant (--math-prompt), Qwen3's thinking switch (--math-enable-thinking);
            rpg_ref.math_reward.chat_prompt_ids. Problems come from rpg_ref.math_data.load_problems
            (a set name such as deepmath_int, a .jsonl/.parquet file, or hf:<dataset id>). Each call
            of sample_prompts draws distinct problems uniformly at random from the trainer's prompt
            generator (so a resumed run draws the same problems as an uninterrupted one).
  reward    the decoded response's final answer checked against the gold answer
            (rpg_ref.math_reward: math-verify when installed, else the documented normalizer; a
            per-answer time limit), +1 / -1 (--math-scoring pm1, the paper's) or 1 / 0 (binary).
            DAPO's soft overlong punishment is the trainer's --overlong-buffer / --overlong-penalty,
            added by the loop for every task (one implementation: rpg_ref.math_reward.overlong_penalty).
            accuracy = fraction of responses whose answer is verified correct.
  evaluate  Mean@k and Pass@k (rpg_ref.evaluation.evaluate_sets) per evaluation set, with --math-eval-n
            samples per problem, every --eval-every steps and at the end; logged in metrics.jsonl as
            eval_<set>_mean@<k>, eval_<set>_pass@<k>, eval_<set>_response_len. Evaluation samples
            from its own seeded random stream, so evaluating (or not) never changes training.
  policy    a Hugging Face causal LM: a checkpoint folder or hub id (pretrained weights), or a
            config.json (file, or a folder holding only one) for a randomly initialized model
            (tests, benchmarks). It is wrapped in MathPolicy, which adds the precision choice and
            gradient checkpointing that the memory budget needs (docs/memory_budget_qwen3_4b_h100.md)
            without any change to the training loop.
  export    at the end of a run the final policy is saved as a plain Hugging Face checkpoint with
            its tokenizer in OUT/hf (what rpg-eval --model and vLLM load); any trainer checkpoint
            can be exported with ``python -m rpg_ref.tasks.math export OUT [DEST]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from rpg_ref.interfaces import Prompt
from rpg_ref.logprobs import LMParts, hf_lm_parts

PROMPT_STYLES = ("answer", "boxed")
SCORINGS = ("pm1", "binary")
DTYPES = ("float32", "bf16-autocast", "bfloat16")
# --math-model TINY_MODEL: Qwen3-0.6B's config from the shared data shrunk to 2 layers of width 64,
# randomly initialized: the real vocabulary, tokenizer and chat template at a size a CPU runs in
# seconds (the math-cpu preset). It is written as a config.json under --cache-dir, which then loads
# like any other config.json (model_source).
TINY_MODEL = "tiny-qwen3"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


# =============================================================================================
# the policy module
# =============================================================================================


class MathPolicy(nn.Module):
    """A Hugging Face causal LM with the trainer's calling convention plus two memory options.

    dtype "float32": parameters and compute in fp32 (CPU default; exact).
    dtype "bf16-autocast": fp32 parameters (the optimizer's master weights: an AdamW step of
        lr 1e-6 on a weight of size 0.02 survives, which it would not on a bf16 weight whose grid
        spacing there is 6e-5) and bf16 matrix products under torch.autocast, in training
        forwards, log-prob passes and HF generation alike.
    dtype "bfloat16": parameters in bf16 (half the memory; small updates are lost to rounding).
    gradient_checkpointing: decoder layers keep only their inputs and recompute their
        activations in the backward pass. HF checkpoints a layer only while it is in training
        mode, but the trainer keeps the policy in eval mode (no dropout, so w = 1 exactly before
        the first update); the layers are therefore switched to training mode for the duration
        of a forward with gradients enabled. Only the layer objects' own flag changes, so
        attention dropout (read from the attention module's flag) stays off.

    The wrapped model is ``self.module``: parameter names gain a ``module.`` prefix (as under
    DDP), which rpg_ref.engines.vllm strips before loading weights into vLLM.
    """

    def __init__(self, model: nn.Module, dtype: str = "float32", gradient_checkpointing: bool = False):
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.module = model
        self.autocast = dtype == "bf16-autocast"
        self.grad_ckpt = gradient_checkpointing
        self._ckpt_layers = []
        if gradient_checkpointing:
            kw = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
                model.activation_checkpointing_enable(kw)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
            from transformers.modeling_layers import GradientCheckpointingLayer

            self._ckpt_layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
            if not self._ckpt_layers:
                raise ValueError(f"{type(model).__name__} has no checkpointable layers")

    # what the trainer, the engines and save/export read from an HF model
    @property
    def config(self):
        return self.module.config

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def save_pretrained(self, *args, **kwargs):
        return self.module.save_pretrained(*args, **kwargs)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    @contextlib.contextmanager
    def _compute(self):
        """bf16 autocast when asked; checkpointed layers in training mode while gradients are on."""
        ckpt = self.grad_ckpt and torch.is_grad_enabled()
        for layer in self._ckpt_layers if ckpt else ():
            layer.training = True
        try:
            with self._autocast():
                yield
        finally:
            for layer in self._ckpt_layers if ckpt else ():
                layer.training = False

    def forward(self, *args, **kwargs):
        # a single forward pass keeps no KV cache (HF's default use_cache=True would allocate one)
        if "past_key_values" not in kwargs:
            kwargs.setdefault("use_cache", False)
        with self._compute():
            return self.module(*args, **kwargs)

    def lm_parts(self) -> LMParts | None:
        """Hidden states and LM head of the wrapped model, each in this policy's precision and
        checkpointing (rpg_ref.logprobs applies the head in chunks), or None if it has no plain head."""
        parts = hf_lm_parts(self.module)
        if parts is None:
            return None

        def hidden(**inputs):
            with self._compute():
                return parts.hidden(**inputs)

        def head(h):
            with self._autocast():
                return parts.head(h)

        return LMParts(hidden, head, parts.vocab_size)

    def generate(self, *args, **kwargs):
        with self._autocast():
            return self.module.generate(*args, **kwargs)


def load_hf_model(spec: str, dtype: str = "float32", attn_implementation: str = "sdpa",
                  device: str | torch.device = "cpu") -> nn.Module:
    """A causal LM from a checkpoint folder / hub id (pretrained), or from a config.json file or a
    folder holding a config.json but no weights (random initialization from torch's global RNG,
    on ``device``: a 4B model initializes in seconds on a GPU, in a minute on a CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    path = Path(spec)
    config_file = path if path.is_file() else path / "config.json"
    if path.is_file() or (path.is_dir() and not any((path / w).exists() for w in WEIGHT_FILES)):
        if not config_file.is_file():
            raise ValueError(f"--math-model {spec!r}: a folder without weights needs a config.json")
        try:
            d = json.loads(config_file.read_text())
            mcfg = AutoConfig.for_model(d.pop("model_type"), **d)
        except (json.JSONDecodeError, KeyError, ValueError) as e:
            raise ValueError(f"--math-model {spec!r}: not a usable model config.json ({e})") from e
        with torch.device(device):
            return AutoModelForCausalLM.from_config(mcfg, dtype=torch_dtype,
                                                    attn_implementation=attn_implementation)
    try:
        return AutoModelForCausalLM.from_pretrained(spec, dtype=torch_dtype,
                                                    attn_implementation=attn_implementation)
    except OSError as e:
        raise ValueError(f"--math-model {spec!r}: not a checkpoint folder, config.json or a "
                         f"reachable Hugging Face model id ({e})") from e


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def check_model_source(spec: str, flag: str) -> None:
    """``spec`` is a local file or folder, a hub id in the local Hugging Face cache, or a hub id
    with the hub reachable. An unreachable hub is found in seconds (one connection attempt), not
    after a minute of download retries; HF_HUB_OFFLINE=1 skips the attempt."""
    if Path(spec).exists():
        return
    if not HUB_ID.fullmatch(spec):
        raise ValueError(f"{flag} {spec!r}: no such file or folder (nor a Hugging Face id 'org/name')")
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(spec, "config.json"), str):
        return  # cached: works offline
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    port = urlparse(constants.ENDPOINT).port or (80 if constants.ENDPOINT.startswith("http:") else 443)
    fix = ("download it where there is a network and pass its folder, or pass a config.json for a "
           "randomly initialized model")
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"{flag} {spec!r} is not a local folder and not in the Hugging Face cache, "
                         f"and HF_HUB_OFFLINE is set: {fix}")
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise ValueError(f"{flag} {spec!r} is not a local folder and not in the Hugging Face cache, "
                         f"and the hub ({host}:{port}) cannot be reached ({e}): {fix}") from e


def model_source(spec: str, cache_dir: str) -> str:
    """--math-model as the loaders take it: TINY_MODEL becomes CACHE_DIR/tiny-qwen3/config.json
    (rewritten when the shared config changes), anything else is returned as it is."""
    if spec != TINY_MODEL:
        return spec
    from rpg_ref.checkpoint import atomic_write
    from rpg_ref.math_data import data_dir, tiny_qwen3_config

    shared = data_dir() / "models" / "qwen3-0.6b" / "config.json"
    if not shared.is_file():
        raise ValueError(f"--math-model {spec} is built from Qwen3-0.6B's config {shared}, which is "
                         f"absent: set RPG_DATA_DIR to the shared data folder (models/, tokenizer/)")
    path = Path(cache_dir) / TINY_MODEL / "config.json"
    text = json.dumps(tiny_qwen3_config(), indent=1)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    return str(path)


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"not a usable tokenizer ({e})") from e


def _flagged(flag: str, value, fn, *args, **kwargs):
    """fn(*args, **kwargs), its ValueError prefixed by the flag (and the value, unless named)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}" if str(value) in str(e) else f"{flag} {value}: {e}") from e


def _default_tokenizer_dir(model_spec: str) -> str:
    """The model's own tokenizer when its folder has one, else the shared Qwen3 tokenizer."""
    from rpg_ref.math_data import data_dir

    p = Path(model_spec)
    folder = p.parent if p.is_file() else p
    if folder.is_dir():
        if (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists():
            return str(folder)
        shared = data_dir() / "tokenizer" / "qwen3"
        if not shared.is_dir():
            raise ValueError(f"--math-model {model_spec!r} has no tokenizer and the shared Qwen3 "
                             f"tokenizer {shared} is absent: pass --math-tokenizer")
        return str(shared)
    return model_spec  # a hub id: its own tokenizer


# =============================================================================================
# the task
# =============================================================================================


class MathTask:
    """The Task protocol for math reasoning (module docstring)."""

    name = "math"
    default_engine = "hf"

    @dataclass
    class Options:
        model: str = field(default="Qwen/Qwen3-4B", metadata={"help": "policy: a Hugging Face "
                           "checkpoint folder or hub id, or a config.json (file or weightless folder) "
                           f"for a randomly initialized model, or {TINY_MODEL!r} (Qwen3-0.6B's "
                           "shared config shrunk to 2 layers of width 64, random: for CPUs)"})
        tokenizer: str = field(default="", metadata={"help": "tokenizer folder or hub id ('' = the "
                               "model's own; the shared Qwen3 tokenizer for a bare config)"})
        dtype: str = field(default="float32", metadata={"help": f"one of {DTYPES}: fp32; fp32 master "
                           "weights with bf16 autocast compute; or bf16 weights (loses tiny updates)"})
        gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute decoder "
                                             "layer activations in the backward pass"})
        attn_implementation: str = field(default="sdpa", metadata={"help": "HF attention kernel "
                                         "(sdpa, eager, flash_attention_2)"})
        train_data: str = field(default="deepmath_int", metadata={"help": "training problems: a set "
                                "name, a .jsonl/.parquet file or hf:<dataset id> (rows with an empty "
                                "answer are dropped)"})
        train_split: str = field(default="train", metadata={"help": "split of an hf: training set"})
        train_limit: int = field(default=0, metadata={"help": "use the first N training problems (0 = all)"})
        answer_field: str = field(default="answer", metadata={"help": "training data's field holding "
                                  "the gold answer (dotted for nested, e.g. reward_model.ground_truth)"})
        problem_field: str = field(default="problem", metadata={"help": "training data's field "
                                   "holding the problem text"})
        max_prompt_tokens: int = field(default=2048, metadata={"help": "drop training problems whose "
                                       "prompt is longer (counted in summary.json; 0 = keep all)"})
        prompt: str = field(default="answer", metadata={"help": "'answer': the paper's 'Answer: "
                            "$Answer' instruction; 'boxed': the \\boxed{} variant"})
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
        eval_limit: int = field(default=0, metadata={"help": "first N problems of each eval set (0 = all)"})
        eval_n: int = field(default=32, metadata={"help": "samples per eval problem (0 = no evaluation)"})
        eval_k: list[int] = field(default_factory=lambda: [32], metadata={"help": "k of Mean@k and "
                                  "Pass@k (each <= eval_n)"})
        eval_temperature: float = field(default=1.0, metadata={"help": "eval sampling temperature "
                                        "(0 = greedy, needs eval_n 1)"})
        eval_top_p: float = field(default=1.0, metadata={"help": "eval nucleus threshold"})
        eval_max_new_tokens: int = field(default=0, metadata={"help": "eval response length (0 = "
                                         "--max-new-tokens)"})
        export: bool = field(default=True, metadata={"help": "save the final policy as a Hugging "
                             "Face checkpoint with its tokenizer in OUT/hf"})

    def __init__(self, cfg, device: torch.device):
        o = self.opt = self.Options(**cfg.task_options)
        self.cfg, self.device = cfg, device
        self._check_options()
        from rpg_ref.math_data import load_problems
        from rpg_ref.math_reward import MathReward, chat_prompt_ids

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
        self.tokenizer_path = o.tokenizer or _default_tokenizer_dir(self.model_spec)
        if self.tokenizer_path != self.model_spec:  # the model's own tokenizer was checked above
            check_model_source(self.tokenizer_path, "--math-tokenizer")
        self.tokenizer = _flagged("--math-tokenizer", self.tokenizer_path, _load_tokenizer,
                                  self.tokenizer_path)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {self.tokenizer_path} has no eos token")
        self.eos_id = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_id

        # training prompts, tokenized once (long prompts dropped and counted)
        ids = [chat_prompt_ids(self.tokenizer, p.problem, o.prompt, o.enable_thinking) for p in probs]
        keep = [i for i, x in enumerate(ids) if not o.max_prompt_tokens or len(x) <= o.max_prompt_tokens]
        self.dropped_long = len(probs) - len(keep)
        self.train = [(probs[i], ids[i]) for i in keep]
        if len(self.train) < cfg.prompts_per_step:
            raise ValueError(f"--math-train-data {o.train_data}: {len(self.train)} usable problems "
                             f"({self.dropped_long} dropped as longer than {o.max_prompt_tokens} "
                             f"prompt tokens) < --prompts-per-step {cfg.prompts_per_step}")
        self.scorer = MathReward(style=o.prompt, scoring=o.scoring, backend=o.checker,
                                 timeout_s=o.check_timeout, num_workers=o.check_workers,
                                 thinking=o.enable_thinking)

    def _check_options(self) -> None:
        o = self.opt

        def bad(msg):
            raise ValueError(f"bad math option: {msg}")

        if o.prompt not in PROMPT_STYLES:
            bad(f"--math-prompt must be one of {PROMPT_STYLES}, got {o.prompt!r}")
        if o.scoring not in SCORINGS:
            bad(f"--math-scoring must be one of {SCORINGS}, got {o.scoring!r}")
        if o.dtype not in DTYPES:
            bad(f"--math-dtype must be one of {DTYPES}, got {o.dtype!r}")
        if o.train_limit < 0 or o.eval_limit < 0 or o.max_prompt_tokens < 0 or o.eval_n < 0:
            bad("--math-train-limit, --math-eval-limit, --math-max-prompt-tokens and --math-eval-n "
                "must be >= 0")
        if o.eval_n:
            if not o.eval_data:
                bad("--math-eval-data is empty (use --math-eval-n 0 for no evaluation)")
            wrong = [k for k in o.eval_k if not 1 <= k <= o.eval_n]
            if wrong or not o.eval_k:
                bad(f"--math-eval-k values must be in [1, --math-eval-n {o.eval_n}], got {o.eval_k}")
            if o.eval_temperature < 0 or not 0 < o.eval_top_p <= 1:
                bad(f"need --math-eval-temperature >= 0 and 0 < --math-eval-top-p <= 1, got "
                    f"{o.eval_temperature}, {o.eval_top_p}")
            if o.eval_temperature == 0 and o.eval_n > 1:
                bad("--math-eval-temperature 0 (greedy) gives identical samples: use --math-eval-n 1")
        if o.eval_max_new_tokens < 0:
            bad(f"--math-eval-max-new-tokens must be >= 0, got {o.eval_max_new_tokens}")

    # --- Task protocol -------------------------------------------------------------------------
    def build_policy(self) -> nn.Module:
        o = self.opt
        model = load_hf_model(self.model_spec, o.dtype, o.attn_implementation, self.device)
        n_vocab = model.get_input_embeddings().weight.shape[0]
        if len(self.tokenizer) > n_vocab:
            raise ValueError(f"tokenizer {self.tokenizer_path} has {len(self.tokenizer)} tokens but the "
                             f"model's embedding has only {n_vocab} rows")
        return MathPolicy(model, o.dtype, o.gradient_checkpointing)

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
        from rpg_ref.evaluation import evaluate_sets

        o = self.opt
        if not o.eval_n:
            return {}
        max_new = o.eval_max_new_tokens or self.cfg.max_new_tokens

        def generate_fn(prompts, n):
            return engine.generate(prompts, n, o.eval_temperature, o.eval_top_p, max_new).responses

        devices = [self.device] if torch.device(self.device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.cfg.seed + 1_000_003)
            results, _ = evaluate_sets(generate_fn, self.tokenizer, self.eval_sets, o.eval_n, o.eval_k,
                                       o.prompt, o.enable_thinking, self.scorer.checker)
        out = {}
        for name, r in results.items():
            for k in o.eval_k:
                out[f"{name}_mean@{k}"] = r[f"mean@{k}"]
                out[f"{name}_pass@{k}"] = r[f"pass@{k}"]
            out[f"{name}_response_len"] = r["mean_response_tokens"]
        return out

    def summary(self, policy, cfg) -> dict:
        """Exports the final policy to OUT/hf (an HF checkpoint with its tokenizer)."""
        dest = Path(cfg.out) / "hf"
        if self.opt.export:
            export_model(policy, self.tokenizer, dest)
        self.scorer.close()
        return {"hf_export": str(dest) if self.opt.export else None, "train_problems": len(self.train),
                "train_problems_dropped_long_prompt": self.dropped_long,
                "answer_checks": self.scorer.checker.stats.as_dict()}


# =============================================================================================
# export: trainer checkpoint -> Hugging Face checkpoint (for rpg-eval, vLLM, the hub)
# =============================================================================================


def export_model(policy: nn.Module, tokenizer, dest: Path) -> Path:
    """save_pretrained of the wrapped model + the tokenizer files into ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    model = policy.module if isinstance(policy, MathPolicy) else policy
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def export_checkpoint(out: str | Path, dest: str | Path | None = None) -> Path:
    """The latest trainer checkpoint of run folder ``out`` (OUT/checkpoints/LATEST) as an HF
    checkpoint in ``dest`` (default OUT/hf). Rebuilds the policy from OUT/config.json."""
    from safetensors.torch import load_model

    from rpg_ref.config import Config
    from rpg_ref.strict_json import loads

    out = Path(out)
    latest = out / "checkpoints" / "LATEST"
    if not (out / "config.json").is_file() or not latest.is_file():
        raise ValueError(f"{out}: not a run folder with a checkpoint (need config.json and "
                         f"checkpoints/LATEST)")
    cfg = Config(**loads((out / "config.json").read_text()))
    if cfg.task != "math":
        raise ValueError(f"{out}: a {cfg.task!r} run, not a math run")
    task = MathTask(cfg, torch.device("cpu"))
    policy = task.build_policy()
    load_model(policy, str(out / "checkpoints" / latest.read_text().strip() / "model.safetensors"))
    return export_model(policy, task.tokenizer, Path(dest) if dest else out / "hf")


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rpg_ref.tasks.math",
                                 description="Export a math run's latest checkpoint as an HF checkpoint.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="OUT/checkpoints/LATEST -> DEST (default OUT/hf)")
    ex.add_argument("out", help="the run folder (rpg-train --out)")
    ex.add_argument("dest", nargs="?", default=None, help="destination folder (default OUT/hf)")
    args = ap.parse_args(argv)
    try:
        dest = export_checkpoint(args.out, args.dest)
    except ValueError as e:
        print(f"export: error: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.out} -> {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
