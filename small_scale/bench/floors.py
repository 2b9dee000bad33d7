"""Each phase of one study run against its floor, measured in one run of this script.

    python -m small_scale.bench.floors                          # study A's urkl-clip-u1, seed 0
    python -m small_scale.bench.floors --study A --cell dapo-u16 --seed 3
    python -m small_scale.bench.floors --task NAME [--preset NAME] -- [more rpg-train flags]

The run: the rpg-train flags small_scale/results/<study>.jsonl recorded for the job (--study,
--cell, --seed), or with --task / --preset a run of that task or preset plus the flags after
``--`` (--threads 1 unless given). Its cache (the seq task's warm start) is filled first, untimed:
every study run but a seed's first is a cached run. The run is then made in this process, each of
its phases timed where the trainer enters it, and afterwards each phase's work is timed again
beside its floor, alternately, --repeats times, on the run's final policy:

  imports      a fresh interpreter importing torch, then transformers' Qwen3 classes, then
               rpg-train's own modules (cli, the task's, the engine's)  |  `python -c pass`
  generation   one rollout call of the hf engine: the run's prompts x group, max_new_tokens new
               tokens each (and --gen-tokens), EOS off  |  static_kv_decode: a hand-written
               decode loop (plain torch ops on the policy's weights, preallocated key/value
               buffers, the same sampling), same prompts and tokens
  log-probs    the trainer's no-grad pass over the rollout batch (log-probs and entropy)  |  a bare
               HF forward of the batch, no grad (logits, log-softmax, gather)
  update       one mini-batch: the trainer's update (forward, loss, backward, clip, AdamW)  |  a
               bare HF loop (logits, log-softmax, a REINFORCE loss, backward, AdamW), and the
               GEMM floor: the matrix products of the trainer's forward and backward, recorded
               from one mini-batch and replayed alone on tensors of the same shapes and strides
               (the attention kernels left out)
  evaluation   the task's evaluate, as the run makes it (the carry task: Mean@4, 4 sampled
               responses for each of 256 held-out prompts; the seq task: one greedy response
               each), scoring included  |  static_kv_decode on the same sequences: the prompts,
               responses per prompt, temperature, top-p and token limit of each generation the
               evaluate makes (recorded from it), stopping when every sequence has ended
  the rest     set-up (task, policy from the cache, engine, optimizer), scoring, checkpoints,
               metrics rows: their time in the run, no floor

Times are CPU seconds (time.process_time; a child's from its rusage): with one torch thread, a
quiet machine's wall time, and on a shared machine the time that is the process's own. A ratio is
the median over repeats of the ratio of adjacent timings. The generation and evaluation floors
need a Qwen3 policy and the hf engine (else their rows say why they are missing).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import math
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from rpg_ref.engines.hf import sample_loop
from rpg_ref.interfaces import left_pad
from small_scale.bench.common import device_name

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "small_scale" / "results"
RUNNER_FLAGS = {"--out": 1, "--cache-dir": 1, "--no-progress": 0, "--progress": 0}  # + values


# ---------------------------------------------------------------------------------------------
# the floors
# ---------------------------------------------------------------------------------------------

def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """Qwen3's RMSNorm, in fp32 as transformers computes it."""
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


@torch.inference_mode()
def static_kv_decode(model, prompts: list, pad_id: int, eos_id: int | None, temperature: float,
                     top_p: float, max_new_tokens: int) -> tuple[Tensor, Tensor]:
    """A Qwen3 causal LM's sampling loop written out: (tokens [B, T], log-probs [B, T]). Prompts
    left-padded to P; key/value buffers of P + T slots allocated once; rotary tables computed once;
    each step attends to the filled slots (a view), its H query heads grouped over the H / R
    key/value heads; sampling and stopping by the hf engine's own sample_loop."""
    m, c = model.model, model.config
    H, KV, d, eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
    R = H // KV
    dev, dt = model.lm_head.weight.device, model.lm_head.weight.dtype
    ids, am = left_pad(prompts, pad_id, dev)  # [B, P]
    B, P = ids.shape
    L = P + max_new_tokens
    pos = (am.cumsum(-1) - 1).clamp(min=0)  # [B, P]
    pos = torch.cat([pos, pos[:, -1:] + torch.arange(1, max_new_tokens + 1, device=dev)], 1)
    angle = pos[..., None].float() * m.rotary_emb.inv_freq.float()  # [B, L, d / 2]
    angle = torch.cat([angle, angle], -1)[:, None]  # [B, 1, L, d]
    cos, sin = angle.cos().to(dt), angle.sin().to(dt)
    K = [torch.zeros(B, KV, L, d, dtype=dt, device=dev) for _ in m.layers]  # [B, KV, L, d]
    V = [torch.zeros(B, KV, L, d, dtype=dt, device=dev) for _ in m.layers]
    seen = torch.zeros(B, L, dtype=torch.bool, device=dev)  # slots holding a real token
    seen[:, :P] = am.bool()
    q_i, k_i = torch.arange(P, device=dev)[:, None], torch.arange(P, device=dev)[None]
    prompt_mask = (((k_i <= q_i) & seen[:, None, :P]) | (k_i == q_i))[:, None]  # [B, 1, P, P]

    def forward(x: Tensor, s: int, mask: Tensor) -> Tensor:  # x [B, n, D] at slots s..s+n
        n = x.shape[1]
        cs, sn = cos[:, :, s : s + n], sin[:, :, s : s + n]
        for i, layer in enumerate(m.layers):
            a, mlp = layer.self_attn, layer.mlp
            h = _rms(x, layer.input_layernorm.weight, eps)
            q = _rms(F.linear(h, a.q_proj.weight).view(B, n, H, d), a.q_norm.weight, eps)
            k = _rms(F.linear(h, a.k_proj.weight).view(B, n, KV, d), a.k_norm.weight, eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, n, d], [B, KV, n, d]
            v = F.linear(h, a.v_proj.weight).view(B, n, KV, d).transpose(1, 2)
            K[i][:, :, s : s + n] = k * cs + _rotate(k) * sn
            V[i][:, :, s : s + n] = v
            q = q * cs + _rotate(q) * sn
            keys, values = K[i][:, :, : s + n], V[i][:, :, : s + n]  # filled slots: views
            if n == 1:  # [B, KV, R, d]: the R query heads of a key/value head as R queries
                o = F.scaled_dot_product_attention(q.reshape(B, KV, R, d), keys, values,
                                                   attn_mask=mask, scale=a.scaling)
            else:
                o = F.scaled_dot_product_attention(q, keys.repeat_interleave(R, 1),
                                                   values.repeat_interleave(R, 1),
                                                   attn_mask=mask, scale=a.scaling)
            o = o.reshape(B, H, n, d).transpose(1, 2).reshape(B, n, H * d)
            x = x + F.linear(o, a.o_proj.weight)
            h = _rms(x, layer.post_attention_layernorm.weight, eps)
            gate = F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight)
            x = x + F.linear(gate, mlp.down_proj.weight)
        return F.linear(_rms(x[:, -1], m.norm.weight, eps), model.lm_head.weight)  # [B, V]

    wide = torch.promote_types(dt, torch.float32)  # logits in fp32 (fp64 for a fp64 model)

    def next_logits(tok: Tensor, t: int) -> Tensor:  # the t-th new token [B] into slot P + t
        seen[:, P + t] = True
        x = m.embed_tokens.weight[tok][:, None]  # [B, 1, D]
        return forward(x, P + t, seen[:, None, None, : P + t + 1]).to(wide)

    logits = forward(m.embed_tokens.weight[ids], 0, prompt_mask).to(wide)
    return sample_loop(logits, next_logits, pad_id, eos_id, temperature, top_p, max_new_tokens)


def bare_hf_step(model, opt, b) -> None:
    """A bare HF training step on a Batch: logits of every position, log-softmax, the response
    tokens' log-probs, a REINFORCE loss, backward, AdamW."""
    T = b.mask.shape[1]
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                   position_ids=b.position_ids).logits[:, -T - 1 : -1]  # [M, T, V]
    logp = logits.float().log_softmax(-1).gather(-1, b.input_ids[:, -T:, None])[..., 0]
    loss = -(b.adv[:, None] * logp * b.mask).sum() / b.mask.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@torch.no_grad()
def bare_hf_logprobs(model, b) -> Tensor:
    """A bare HF forward of a Batch without gradients: the response tokens' log-probs [N, T]."""
    T = b.mask.shape[1]
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                   position_ids=b.position_ids).logits[:, -T - 1 : -1]
    return logits.float().log_softmax(-1).gather(-1, b.input_ids[:, -T:, None])[..., 0] * b.mask


GEMMS = ("mm", "addmm", "bmm", "baddbmm")


class RecordGemms(TorchDispatchMode):
    """Records every matrix product (GEMMS) that runs: its op and its arguments' shapes, strides
    and dtypes (other arguments as they are)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in GEMMS:
            spec = [(a.shape, a.stride(), a.dtype) if isinstance(a, Tensor) else a for a in args]
            self.calls.append((func, spec, kwargs or {}))
        return func(*args, **(kwargs or {}))


def gemm_replay(calls: list):
    """A function running the recorded matrix products alone on random tensors of their shapes,
    strides and dtypes, allocated once; and their FLOPs."""
    def tensor(shape, stride, dtype):  # an expanded (stride 0) argument stays one
        size = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        return torch.randn(size, dtype=dtype).as_strided(shape, stride)

    ready = [(f, [tensor(*a) if isinstance(a, tuple) else a for a in spec], kw)
             for f, spec, kw in calls]
    flops = 0
    for f, args, _ in ready:
        x, y = (args[1], args[2]) if f.__name__.startswith(("addmm", "baddbmm")) else args[:2]
        flops += 2 * x.shape[:-1].numel() * x.shape[-1] * y.shape[-1]

    def run():
        for f, args, kw in ready:
            f(*args, **kw)

    return run, flops


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------

def cpu_s(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


class Row(NamedTuple):
    """One line of the second table: a piece of work, its floor, their times and ratio."""
    work: str
    floor: str
    its_s: float | None = None
    floor_s: float | None = None
    ratio: float | None = None
    lo: float | None = None  # the smallest and largest ratio of a pair of timings
    hi: float | None = None


def generate_calls(engine, fn) -> list[tuple]:
    """(prompts, n, temperature, top_p, max_new_tokens) of each ``engine.generate`` call that
    ``fn()`` makes: the work a floor must do to stand beside ``fn``."""
    calls, real = [], engine.generate

    def spy(prompts, n, temperature, top_p, max_new_tokens, *args, **kwargs):
        calls.append((list(prompts), n, temperature, top_p, max_new_tokens))
        return real(prompts, n, temperature, top_p, max_new_tokens, *args, **kwargs)
    engine.generate = spy
    try:
        fn()
    finally:
        del engine.generate   # the class's own again
    return calls


def evaluation_work(calls: list[tuple]) -> str:
    """The generation ``calls`` in words: "256 prompts x 4, sampled at temperature 1.0, up to 40
    new tokens (1024 sequences)"."""
    words = [f"{len(prompts)} prompts x {n}, "
             + ("greedy" if temp == 0 else f"sampled at temperature {temp:g}")
             + f", up to {T} new tokens" for prompts, n, temp, _, T in calls]
    total = sum(len(prompts) * n for prompts, n, *_ in calls)
    return "; ".join(words) + f" ({total} sequences)"


def paired(work: str, fn, floor: str, floor_fn, repeats: int) -> Row:
    """fn and floor_fn timed alternately, after one untimed call of each: their median seconds
    and the median (and range) of the ratio of each pair."""
    fn(), floor_fn()
    a, b = [], []
    for _ in range(repeats):
        a.append(cpu_s(fn))
        b.append(cpu_s(floor_fn))
    ratios = [x / y for x, y in zip(a, b)]
    return Row(work, floor, statistics.median(a), statistics.median(b),
               statistics.median(ratios), min(ratios), max(ratios))


def child_cpu_s(code: str) -> tuple[float, str]:
    """CPU seconds (user + system) of a fresh `python -c code`, and what it printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, cwd=ROOT).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def import_times(cfg, repeats: int) -> Row:
    """Fresh interpreters, alternately: `python -c pass`, and one importing the run's modules in
    stages (torch, transformers' Qwen3 classes, rpg-train's modules), each stage's CPU seconds
    read by the child itself (their medians named in the row's work)."""
    from rpg_ref.registry import ENGINES, TASKS

    modules = ["rpg_ref.cli"] + [reg[k].partition(":")[0] for reg, k in
                                 ((TASKS, cfg.task), (ENGINES, cfg.engine))
                                 if isinstance(reg[k], str)]
    stages = {"torch": "import torch",
              "transformers' Qwen3": "from transformers import Qwen3Config, Qwen3ForCausalLM",
              "rpg-train's modules": "; ".join(f"import {m}" for m in modules)}
    cpu = "r = resource.getrusage(resource.RUSAGE_SELF)\nt.append(r.ru_utime + r.ru_stime)\n"
    code = "import resource\nt = []\n" + cpu + "".join(f"{x}\n{cpu}" for x in stages.values())
    code += "print(*t)\n"
    bare, total, parts = [], [], []
    for _ in range(repeats):
        bare.append(child_cpu_s("pass")[0])
        seconds, printed = child_cpu_s(code)
        total.append(seconds)
        parts.append([y - x for x, y in itertools.pairwise(map(float, printed.split()))])
    ratios = [x / y for x, y in zip(total, bare)]
    med = statistics.median
    each = ", ".join(f"{k} {med(p[i] for p in parts):.2f} s" for i, k in enumerate(stages))
    return Row(f"python start + imports ({each})", "`python -c pass`", med(total), med(bare),
               med(ratios), min(ratios), max(ratios))


# ---------------------------------------------------------------------------------------------
# the run, its phases timed
# ---------------------------------------------------------------------------------------------

def study_argv(study: str, cell: str, seed: int, results: Path = RESULTS) -> list:
    """The rpg-train flags of a study job as its results row records them, without the runner's
    own (--out, --cache-dir, --no-progress)."""
    from paper_figs.training import read_study_rows

    path = Path(results) / f"{study}.jsonl"
    if not path.is_file():
        raise ValueError(f"no results file {path}: name a study that has run (--study), or give "
                         f"--task")
    rows = [r for r in read_study_rows(path) if r["cell"] == cell and r["seed"] == seed]
    if not rows:
        raise ValueError(f"{path} holds no run of cell {cell!r}, seed {seed}: pick a cell and "
                         f"seed that ran, or give --task")
    argv = rows[-1]["argv"][3:]  # after `python -m rpg_ref.cli`
    out, i = [], 0
    while i < len(argv):
        skip = RUNNER_FLAGS.get(argv[i])
        if skip is None:
            out.append(argv[i])
        i += 1 + (skip or 0)
    return out


class Phases:
    """CPU and wall seconds of the run's phases: the trainer's progress calls mark where each
    begins (rpg_ref.trainer.metrics.Progress), engine.generate and update calls are timed
    inside them."""

    def __init__(self):
        self.cpu, self.wall, self.current, self.calls = {}, {}, "other", {}
        self.t = (time.process_time(), time.perf_counter())

    def mark(self, name: str) -> None:
        c, w = time.process_time(), time.perf_counter()
        self.cpu[self.current] = self.cpu.get(self.current, 0.0) + c - self.t[0]
        self.wall[self.current] = self.wall.get(self.current, 0.0) + w - self.t[1]
        self.current, self.t = name, (c, w)

    def timed(self, label: str, fn):
        """fn, its calls' CPU seconds added to calls[(phase, label)] = [seconds, count]."""
        def call(*args, **kwargs):
            t = time.process_time()
            out = fn(*args, **kwargs)
            acc = self.calls.setdefault((self.current, label), [0.0, 0])
            acc[0] += time.process_time() - t
            acc[1] += 1
            return out
        return call


def timed_run(argv: list, out: Path) -> tuple[Phases, SimpleNamespace]:
    """Fill the run's cache (untimed), then run it in this process with its phases timed."""
    import rpg_ref.trainer.train as T
    from rpg_ref.cli import parse_config
    from rpg_ref.trainer.metrics import Progress

    cfg = parse_config([*argv, "--out", str(out / "run"), "--no-progress"])
    T.prepare(dataclasses.replace(cfg, out=str(out / "warm")))  # the cache: untimed
    phases = Phases()
    seen = SimpleNamespace(batch=None, updates=0)

    class Clock(Progress):
        def __init__(self, total, initial, enabled):
            super().__init__(total, initial, False)

        def phase(self, name):
            phases.mark(name)

        def update(self, step, total, row):
            phases.mark("checkpoint")  # the metrics row and the checkpoint are written next

        def close(self):
            phases.mark("other")

    def update(policy, opt, b, cfg, loss_opts):
        result = trainer_update(policy, opt, b, cfg, loss_opts)
        seen.batch, seen.updates = b, seen.updates + result["updates"]
        return result

    trainer_update = T.update
    timed_update = phases.timed("update()", update)
    T.Progress, T.update = Clock, timed_update
    try:
        phases.mark("set-up")
        run = T.prepare(cfg)
        run.engine.generate = phases.timed("generate()", run.engine.generate)
        run.task.evaluate = phases.timed("evaluate()", run.task.evaluate)
        phases.mark("other")
        T.train(cfg, run)
        phases.mark("end")
    finally:
        T.Progress, T.update = Progress, trainer_update
    del run.engine.generate, run.task.evaluate  # the classes' own again
    return phases, SimpleNamespace(cfg=cfg, run=run, batch=seen.batch, updates=seen.updates,
                                   update=trainer_update)


# ---------------------------------------------------------------------------------------------
# each phase's work beside its floor
# ---------------------------------------------------------------------------------------------

def floors(r: SimpleNamespace, gen_tokens: list, repeats: int) -> list[Row]:
    """Each phase's work beside its floor, on the run's final policy."""
    from rpg_ref.engines.hf import HFEngine
    from rpg_ref.trainer.train import batch_logprobs

    cfg, run = r.cfg, r.run
    task, policy = run.task, run.policy
    model = getattr(policy, "module", policy)
    engine = run.engine.engine  # the engine inside the loop's OnPolicy / LaggedEngine
    rows = []
    if not isinstance(engine, HFEngine):
        rows.append(Row("generation, evaluation", "(no floor: the run's engine is not hf)"))
    elif getattr(model.config, "model_type", None) != "qwen3":
        rows.append(Row("generation, evaluation", "(no floor: the policy is not a Qwen3)"))
    else:
        prompts = [p.ids for p in task.sample_prompts(cfg.prompts_per_step,
                                                      torch.Generator().manual_seed(0))]
        flat = [p for p in prompts for _ in range(cfg.group_size)]
        no_eos = HFEngine(policy, SimpleNamespace(eos_id=None, pad_id=task.pad_id), cfg)
        temp, top_p, G = cfg.temperature, cfg.top_p, cfg.group_size
        for T in dict.fromkeys([cfg.max_new_tokens, *gen_tokens]):
            rows.append(paired(
                f"generation: {len(prompts)} prompts x {G}, {T} new tokens (EOS off)",
                lambda T=T: no_eos.generate(prompts, G, temp, top_p, T), "static-KV loop",
                lambda T=T: static_kv_decode(model, flat, task.pad_id, None, temp, top_p, T),
                repeats))
        evaluate = lambda: run.engine.evaluate(task, policy)
        calls = generate_calls(engine, evaluate)
        if not calls:
            rows.append(Row("evaluation", "(no floor: the task's evaluation generates nothing)"))
        else:
            rows.append(paired(f"evaluation: {evaluation_work(calls)}, scored (the task's "
                               f"evaluate)", evaluate,
                               "static-KV loop, the same sequences",
                               lambda: [static_kv_decode(model, [p for p in prompts for _ in
                                                                 range(n)], task.pad_id,
                                                         task.eos_id, temp, top_p, T)
                                        for prompts, n, temp, top_p, T in calls], repeats))
    b = r.batch
    rows.append(paired(f"log-probs: the batch of {len(b)}",
                       lambda: batch_logprobs(policy, b, cfg, entropy=True),
                       "bare HF forward", lambda: bare_hf_logprobs(policy, b), repeats))
    M = min(cfg.mini_batch_size, len(b))
    mb = b.index(slice(0, M))
    # one optimizer step per call, never stopped early (the copy drifts from old_logp)
    one = dataclasses.replace(cfg, mini_batch_size=M, updates_per_step=1, kappa=math.inf)

    def fresh():  # a copy of the policy and a new AdamW (fused, as the trainer's)
        p = copy.deepcopy(policy)
        return p, torch.optim.AdamW(p.parameters(), lr=cfg.lr, fused=True)

    (p1, o1), (p2, o2) = fresh(), fresh()
    trainer = lambda: r.update(p1, o1, mb, one, run.loss)
    work = f"update: 1 mini-batch of {M}"
    rows.append(paired(work, trainer, "bare HF loop", lambda: bare_hf_step(p2, o2, mb), repeats))
    with RecordGemms() as rec:
        trainer()
    replay, flops = gemm_replay(rec.calls)
    rows.append(paired(work, trainer, f"GEMM floor ({len(rec.calls)} matrix products, "
                                      f"{flops / 1e9:.2f} GFLOP)", replay, repeats))
    return rows


# ---------------------------------------------------------------------------------------------
# the tables
# ---------------------------------------------------------------------------------------------

def phase_table(phases: Phases, imports: Row, updates: int) -> list[str]:
    """The run's phases: CPU seconds and share of a fresh process's run."""
    cpu = phases.cpu
    call = lambda phase, label: phases.calls.get((phase, label), [0.0, 0])
    gen, upd, ev = (call("rollout", "generate()"), call("update", "update()"),
                    call("evaluation", "evaluate()"))
    in_run = {
        "python start + imports (a fresh process)": imports.its_s,
        "set-up: task, policy (cached), engine, optimizer": cpu.get("set-up", 0.0),
        "rollout: generation": gen[0],
        "rollout: scoring, batch": cpu.get("rollout", 0.0) - gen[0],
        "log-probs": cpu.get("log-probs", 0.0),
        "update": upd[0],
        "evaluation": ev[0],
        "checkpoints, metrics rows": cpu.get("checkpoint", 0.0),
    }
    in_run["other: the loop's own, weight sync, summary"] = (
        sum(cpu.values()) - sum(list(in_run.values())[1:]))
    total = sum(in_run.values())
    per = lambda c, n: c / max(n, 1) * 1e3
    return (["| phase | CPU s | share |", "|---|---|---|"]
            + [f"| {k} | {v:.2f} | {v / total:.1%} |" for k, v in in_run.items()]
            + [f"| **the run** | **{total:.2f}** | 100% |", "",
               f"In the run: rollout calls of the engine {gen[1]} ({per(*gen):.1f} ms each), "
               f"evaluations {ev[1]} ({per(*ev):.1f} ms each), mini-batch updates {updates} "
               f"({per(upd[0], updates):.1f} ms each); in this process "
               f"{sum(phases.cpu.values()):.2f} s CPU, {sum(phases.wall.values()):.2f} s wall."])


def floor_table(rows: list[Row]) -> list[str]:
    """Each piece of work beside its floor: CPU times and their ratio (its range over repeats)."""
    t = lambda s: f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms"
    out = ["| work | its CPU time | floor | floor's CPU time | ratio (range) |",
           "|---|---|---|---|---|"]
    for r in rows:
        if r.its_s is None:
            out.append(f"| {r.work} | | {r.floor} | | |")
            continue
        out.append(f"| {r.work} | {t(r.its_s)} | {r.floor} | {t(r.floor_s)} | "
                   f"{r.ratio:.2f}x ({r.lo:.2f}-{r.hi:.2f}) |")
    return out


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--study", default="A", help="the study whose recorded run to make")
    ap.add_argument("--cell", default="urkl-clip-u1", help="its cell")
    ap.add_argument("--seed", type=int, default=0, help="its seed index")
    ap.add_argument("--task", default=None,
                    help="instead: rpg-train --task NAME (+ the flags after --)")
    ap.add_argument("--preset", default=None, help="instead: rpg-train --preset NAME (+ flags)")
    ap.add_argument("--gen-tokens", type=int, nargs="*", default=[64],
                    help="also time generation at these response lengths (EOS off)")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats of each comparison")
    ap.add_argument("--cache-dir", default="runs/cache", help="rpg-train --cache-dir")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    bad = [f"--{k.replace('_', '-')} must be >= 1, got {v}" for k, v in
           (("repeats", args.repeats), *(("gen_tokens", t) for t in args.gen_tokens)) if v < 1]
    if extra and not (args.task or args.preset):
        bad.append("flags after -- go with --task or --preset (a study's run has its own)")
    if bad:
        print("bench_floors: " + "; ".join(bad), file=sys.stderr)
        return 2
    try:
        if args.task or args.preset:
            run_argv = ([*(["--task", args.task] if args.task else []),
                         *(["--preset", args.preset] if args.preset else []), *extra]
                        + ([] if "--threads" in extra else ["--threads", "1"]))
            what = "rpg-train " + shlex.join(run_argv)
        else:
            run_argv = study_argv(args.study, args.cell, args.seed)
            what = f"study {args.study}, cell {args.cell}, seed {args.seed}: rpg-train " + \
                shlex.join(run_argv)
        run_argv += ["--cache-dir", args.cache_dir]
        from rpg_ref.cli import parse_config
        with tempfile.TemporaryDirectory() as tmp:
            parse_config([*run_argv, "--out", str(Path(tmp) / "check")])  # before any work
    except ValueError as e:
        print(f"bench_floors: {e}", file=sys.stderr)
        return 2
    import transformers

    threads, load = torch.get_num_threads(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        phases, r = timed_run(run_argv, Path(tmp))
        imports = import_times(r.cfg, args.repeats)
        rows = floors(r, args.gen_tokens, args.repeats)
    torch.set_num_threads(threads)
    print(f"{what}\n{device_name('cpu').split(',')[0]}, {r.cfg.threads or threads} torch "
          f"thread(s) in the run, torch {torch.__version__}, transformers "
          f"{transformers.__version__}; load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print("\n".join(phase_table(phases, imports, r.updates)))
    print(f"\nEach phase's work again beside its floor, alternately, {args.repeats} times "
          f"(medians):\n")
    print("\n".join(floor_table([imports, *rows])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
