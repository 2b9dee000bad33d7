"""What a run reports: OUT/metrics.jsonl (one JSON object per step), TensorBoard, the progress
bar, and the memory probes.

    key                    meaning
    step                   training step = one rollout batch and its inner optimizer loop (1-based)
    reward                 mean reward of the batch (incl. overlong penalty), pi_old samples
    accuracy               fraction of responses the task's verifier marks correct
    entropy                token-mean entropy of pi_old (temperature-scaled) on the response tokens
    response_len           mean response length in tokens (EOS included)
    kl_old                 mean over mini-batches of stats["kl_old"], token-level
                           KL(pi_theta||pi_old)
    kl_old_last            the running estimate (window = one pass) when the inner loop ended
    kl_ref                 token-mean k3 estimate of KL(pi_old || pi_ref) at rollout
                           (0: iterative ref)
    kl_loss                mean over mini-batches of stats["kl"], the loss's own divergence
                           estimate
    clip_frac_low/high/dual mean fractions of units clipped by the low / high / dual bound
    ratio_mean             mean importance ratio w over the mini-batches
    loss                   mean loss value over the mini-batches that were stepped
    grad_norm              mean gradient norm before clipping
    updates                optimizer steps taken this step (<= K); early_stop 1 if kappa stopped it
    lr                     learning rate used this step
    logprob_diff_max       max |sampler log-prob - recomputed log-prob| (engines that report them)
    rc_weight_mean         --rollout-correction tis|mis: mean weight min(r, C) or r 1{r <= C} over
                           units (tokens or responses), r = pi_old / pi_sampler
                           (rpg_ref.trainer.rollout_correction)
    rc_capped_frac         fraction of units with r > C (truncated to C by tis, weight 0 by mis)
    rc_log_ratio_max       max |log r| over units (0 when the sampler is exactly pi_old)
    rc_ess                 effective sample size fraction of the weights, (sum w)^2 / (n sum w^2)
    dyn_rounds, dyn_kept   DAPO dynamic sampling: generation rounds, groups with non-constant
                           rewards
    dyn_filled             1 if the batch was filled with informative groups, 0 if the cap was hit
    gen_tokens_per_s       generated tokens / rollout seconds
    train_tokens_per_s     response tokens processed by the optimizer loop / update seconds
    time_rollout, time_scoring, time_logprob, time_update, time_step   seconds per phase
    peak_mem_mb            peak RSS of the process (CPU) or max CUDA memory allocated (GPU), MiB
    eval_*                 task evaluation (every --eval-every steps and at the end)

Under torchrun (rpg_ref/trainer/distributed/) every value covers all ranks' responses; time_* are
rank 0's, peak_mem_mb is the largest rank's, and rank 0 writes the file.
"""

from __future__ import annotations

import gc
import math
import re
import resource
import sys
from pathlib import Path

import torch
from torch import nn

from rpg_ref.strict_json import dumps, loads, step_rows
from rpg_ref.trainer.collectives import max_over_ranks
from rpg_ref.trainer.errors import Diverged, ResumeError, exploitation_advice, flag_advice
from rpg_ref.trainer.files import atomic_write


class MetricsLog:
    """OUT/metrics.jsonl (+ TensorBoard). On resume, rows after the checkpoint's step are
    dropped, and the rows kept must be steps 1..checkpoint, each once (ResumeError otherwise: a
    run never continues with a hole in its record)."""

    def __init__(self, out: Path, start_step: int, tensorboard: bool):
        self.path = out / "metrics.jsonl"
        if self.path.exists() or start_step:
            keep = continuous_rows(self.path, start_step)
            atomic_write(self.path, "".join(ln + "\n" for ln in keep))
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out / "tb"))

    def _lines(self) -> list:
        """The complete rows (a row cut short by a kill has no newline: its step is redone)."""
        text = self.path.read_text() if self.path.exists() else ""
        return [ln for ln in text[: text.rfind("\n") + 1].splitlines() if ln.strip()]

    def rows(self) -> list[dict]:
        """The rows written so far ([] for a new run)."""
        return [loads(line) for line in self._lines()]

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(dumps(row) + "\n")
            f.flush()  # survives a killed process (the OS holds the data)
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, row["step"])


def continuous_rows(path: Path, start: int) -> list[str]:
    """The lines of steps 1..start, in order; ResumeError (one line: file:line for a bad row, else
    the missing or repeated steps) when they are not exactly those steps."""
    try:
        rows = step_rows(path)
    except ValueError as e:
        raise ResumeError(str(e)) from None
    keep = [line for _, row, line in rows if row["step"] <= start]
    steps = [row["step"] for _, row, _ in rows if row["step"] <= start]
    if steps == list(range(1, start + 1)):
        return keep
    if not path.exists():
        what = "is missing"
    else:
        missing = sorted(set(range(1, start + 1)) - set(steps))
        twice = sorted({s for s in steps if steps.count(s) > 1})
        what = ", ".join(
            ([f"lacks the rows of steps {_ranges(missing)}"] if missing else [])
            + ([f"holds steps {_ranges(twice)} more than once"] if twice else [])
        ) or "has its rows out of order"
    raise ResumeError(f"{path} {what}, but the checkpoint is at step {start}: a resumed run would "
                      f"have a hole in its record; restore the file, or start the run again "
                      f"with another --out")


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(out)


def failure_line(e: BaseException, out: Path, cfg, params) -> str | None:
    """One line for an error raised inside a step because values became non-finite (a sampler or
    a loss refusing NaN log-probs after an update blew the weights up); None for other errors."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    weights_bad = not all(bool(torch.isfinite(p.detach()).all()) for p in local)
    said = re.search(r"non-finite|\b(nan|inf)\b", str(e), re.IGNORECASE)
    if not (weights_bad or said):
        return None
    step = last_step(out / "metrics.jsonl") + 1
    what = "the weights are not finite" if weights_bad else "values became non-finite"
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    return (f"step {step}: {what} ({type(e).__name__}: {first}): training diverged; "
            f"{flag_advice(cfg)}")


def last_step(path: Path) -> int:
    """The step of the last complete row of a metrics file (0: none, or a file that is no log)."""
    try:
        rows = step_rows(path)
    except (OSError, ValueError):
        return 0
    return rows[-1][1]["step"] if rows else 0


class Watch:
    """Run health, read off each step's row (values the loop has already computed: it costs
    nothing), telling success from failure. ``check(row)`` runs before the row and the checkpoint
    are written; ``verdict()`` at the end of the run:

    - diverged: a non-finite loss, gradient norm or entropy stops the run (Diverged, one line);
    - converged: a gradient that is exactly 0 on every update of ZERO_STEPS steps in a row while
      every response is correct (accuracy 1), and nothing pulls the policy elsewhere (pi_ref =
      pi_old, or beta 0: the KL-regularized optimum is then that policy) -> summary.json's
      "health" says so, and no warning;
    - not learning: such a zero gradient otherwise (stuck on a wrong answer, or saturated away
      from the optimum) -> a warning naming the steps;
    - collapsed: the accuracy of the last WINDOW steps (the fraction of responses the task's
      verifier marks correct: the reward's success part, on one [0, 1] scale for every task) is
      below half of step 1's (the initial policy's) and below it by more than 3 standard errors of
      that start, sqrt(p (1 - p) / n) for n responses, with step 1's at least MIN_START; or a
      held-out accuracy (an eval_*accuracy* value) below half of the run's first evaluation ->
      a warning naming the step it fell from and the likely flags.

    ``verdict`` returns at most one warning per run (a collapse before a zero gradient): it is
    printed once, at the end, on a line of its own (Progress.say)."""

    ZERO_STEPS, WINDOW, MIN_START = 3, 10, 0.1

    def __init__(self, cfg, rows: list = ()):
        """``rows``: the run's rows so far (a resumed run's), read as if checked again."""
        self.cfg, self.rows, self.zero, self.stuck, self.converged = cfg, [], [], None, None
        for row in rows:
            self.check(row)

    def check(self, row: dict) -> None:
        keys = ("entropy", "loss", "grad_norm") if row.get("updates") else ("entropy",)
        bad = [k for k in keys if not math.isfinite(row[k])]
        if bad:
            raise Diverged(f"step {row['step']}: {' and '.join(f'{k} is {row[k]}' for k in bad)}: "
                           f"training diverged; {flag_advice(self.cfg)}")
        self.rows.append(row)
        self.zero = self.zero + [row] if row.get("updates") and row["grad_norm"] == 0 else []
        if len(self.zero) < self.ZERO_STEPS or self.stuck or self.converged:
            return
        at_optimum = self.cfg.ref == "iterative" or not self.cfg.beta
        if at_optimum and all(r.get("accuracy") == 1 for r in self.zero):
            self.converged = (f"converged at step {self.zero[0]['step']}: every response correct "
                              f"and every update's gradient 0 (nothing left to learn)")
        else:
            self.stuck = (f"steps {self.zero[0]['step']}-{row['step']}: every update had a zero "
                          f"gradient (mean reward {row['reward']:.3g}, entropy "
                          f"{row['entropy']:.3g}): the policy is not learning; if it diverged, "
                          f"{flag_advice(self.cfg)}")

    def collapse(self) -> str | None:
        """The collapse rule (class docstring) on the rows so far: its line, or None. A fall while
        the training reward rose is told apart: the reward is being exploited."""
        falls = [f for f in (self._held_out_fall(), self._accuracy_fall()) if f]
        if not falls:
            return None
        rows, last = self.rows, self.rows[-self.WINDOW:]
        steps = f"over steps {last[0]['step']}-{last[-1]['step']}"
        rest = lambda r: r["reward"] - r.get("accuracy", 0.0)  # the reward beyond correctness
        rewards = [(r["reward"], rest(r)) for r in last]
        reward, beyond = (sum(x) / len(rewards) for x in zip(*rewards))
        if rows[0]["step"] == 1 and reward > rows[0]["reward"]:  # the gold measure fell, not it
            return (f"the reward is being exploited: the training reward rose from "
                    f"{rows[0]['reward']:.3g} at step 1 to {reward:.3g} {steps} while "
                    f"{falls[0]}; {exploitation_advice(self.cfg)}")
        if rows[0]["step"] == 1 and beyond > rest(rows[0]) + 1e-9:
            return (f"the reward is being exploited: its part beyond the accuracy (reward - "
                    f"accuracy: a token cost, a length penalty) rose from {rest(rows[0]):.3g} at "
                    f"step 1 to {beyond:.3g} {steps} while {falls[0]}; "
                    f"{exploitation_advice(self.cfg)}")
        return f"the policy collapsed: {falls[-1]}; {flag_advice(self.cfg)}"

    def _accuracy_fall(self) -> str | None:
        """The training accuracy's fall (class docstring), or None."""
        rows = self.rows
        if len(rows) > self.WINDOW and rows[0]["step"] == 1 and "accuracy" in rows[0]:
            p0, n = rows[0]["accuracy"], self.cfg.prompts_per_step * self.cfg.group_size
            last = rows[-self.WINDOW:]
            now = sum(r["accuracy"] for r in last) / len(last)
            if p0 >= self.MIN_START and now < min(p0 / 2, p0 - 3 * math.sqrt(p0 * (1 - p0) / n)):
                since = next(r["step"] for r in reversed(rows) if r["accuracy"] >= p0 / 2) + 1
                reward = sum(r["reward"] for r in last) / len(last)
                return (f"accuracy {now:.3g} over steps {last[0]['step']}-{last[-1]['step']} "
                        f"(mean reward {reward:.3g}), down from {p0:.3g} at step 1, every step "
                        f"below half of it since step {since}")
        return None

    def _held_out_fall(self) -> str | None:
        """The first held-out accuracy (an eval_*accuracy* key) below half its first value."""
        rows = self.rows
        for key in dict.fromkeys(k for r in rows for k in r if k.startswith("eval_")
                                 and "accuracy" in k):
            evals = [(r["step"], r[key]) for r in rows if key in r]
            (first_step, first), (step, now) = evals[0], evals[-1]
            if len(evals) > 1 and first >= self.MIN_START and now < first / 2:
                return (f"held-out {key[5:]} {now:.3g} at step {step}, down from {first:.3g} at "
                        f"step {first_step}")
        return None

    def verdict(self) -> str | None:
        """At the end of the run: its one warning line, or None."""
        line = self.collapse() or self.stuck
        return None if line is None else f"rpg-train: warning: {line}"

    def health(self) -> str:
        """What summary.json records of the run's health."""
        return self.collapse() or self.stuck or self.converged or "ok"


class Progress:
    """A tqdm bar when tqdm is installed, else one line per step (or nothing when disabled).
    ``phase`` names the part of a step that is running (rollout, log-probs, update, evaluation,
    checkpoint) in the bar's description while steps are slow (over a second). Used as a context
    manager around the loop: a run that ends on an exception (Ctrl-C, a failure) clears the bar,
    so that the one line saying why stands alone."""

    SLOW_S = 1.0

    def __init__(self, total: int, initial: int, enabled: bool):
        self.bar, self.enabled, self.slow = None, enabled, True  # slow until a step says otherwise
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, desc="rpg-train", dynamic_ncols=True)
            except ImportError:
                pass

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind, *_) -> None:
        if self.bar is not None:
            self.bar.leave = kind is None  # an exception: its line replaces the bar
            self.bar.set_description_str("rpg-train", refresh=False)
            self.bar.close()

    def phase(self, name: str) -> None:
        if self.bar is not None and self.slow:
            self.bar.set_description_str(f"rpg-train [{name}]")

    def update(self, step: int, total: int, row: dict) -> None:
        msg = {k: f"{row[k]:.3g}" for k in ("reward", "accuracy", "kl_old", "entropy") if k in row}
        self.slow = row.get("time_step", 0.0) > self.SLOW_S
        if self.bar is not None:
            self.bar.set_description_str("rpg-train", refresh=False)
            self.bar.set_postfix(msg)
            self.bar.update(1)
        elif self.enabled:
            print(
                f"step {step}/{total} " + " ".join(f"{k}={v}" for k, v in msg.items()), flush=True
            )

    def say(self, line: str) -> None:
        """``line`` on stderr, never on the bar's line (tqdm clears it, writes, redraws it)."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB: CUDA max allocated on GPU; on CPU the process's peak RSS (VmHWM). Under
    torchrun the largest rank's (every rank calls this: a collective)."""
    return max_over_ranks(_peak_memory_mb(device))


def _peak_memory_mb(device: torch.device) -> float:
    """This process's peak. VmHWM belongs to this process image; ru_maxrss is not used on Linux
    because it carries over the peak of a parent that forked us (a big parent would inflate it)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    # Linux: KiB; elsewhere approx.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def live_parameter_count() -> int:
    """Elements in all nn.Parameter objects alive in this process (counts every model copy).
    Only elements with memory count: a sharded (DTensor) parameter counts this rank's shard, and
    meta-device or freed parameters (FSDP's resharded full-size views) count nothing."""
    gc.collect()
    seen, n = set(), 0
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance(): that would read attributes of every object
        # a DTensor parameter keeps its own type and is marked _is_param
        is_param = issubclass(kind, nn.Parameter) or (
            issubclass(kind, torch.Tensor) and getattr(obj, "_is_param", False))
        if is_param and id(obj) not in seen:
            seen.add(id(obj))
            t = obj.to_local() if hasattr(obj, "to_local") else obj
            if t.device.type != "meta" and t.untyped_storage().size() > 0:
                n += t.numel()
    return n


START_EVAL = "eval_at_start.json"  # OUT/: the evaluation of the initial policy, before step 1


def evaluation_at_start(out: Path, workers, device, fresh: bool, main: bool) -> dict:
    """{eval_<key>: value} of the task's evaluation of the initial policy (a warm start's), before
    any step: what the final evaluation is compared with. A fresh run computes it outside the
    training stream (torch's generators are as they were after it: the run is the same with or
    without it) and rank 0 writes it to OUT/eval_at_start.json; a resumed run reads it back."""
    if not fresh:
        path = out / START_EVAL
        return loads(path.read_text()) if main and path.is_file() else {}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        result = {f"eval_{k}": v for k, v in workers.evaluate().items()}
    if main:
        atomic_write(out / START_EVAL, dumps(result, indent=1))
    return result
