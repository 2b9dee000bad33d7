"""rpg_ref/tasks/warm_cache.py: runs that start together with the same warm start train it once
(the others wait on the lock and load the same weights); a later run loads it; another key trains
again."""

import multiprocessing as mp
import time
from pathlib import Path

import torch
from torch import nn

from rpg_ref.tasks.warm_cache import cached_warm_start


def trainer(log_path):
    def warm_start(model):
        with open(log_path, "a") as f:
            f.write("trained\n")
        time.sleep(1.0)  # long enough that the other run arrives while this one trains
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(int(
                    time.time_ns() % 1000))))  # different in every call: tells who trained
    return warm_start


def start(cache, log, key, out):
    torch.manual_seed(0)
    model = cached_warm_start(nn.Linear(3, 2), cache, "toy", key, trainer(log))
    torch.save(model.state_dict(), out)


def test_runs_starting_together_train_the_warm_start_once(tmp_path):
    cache, log = str(tmp_path / "cache"), str(tmp_path / "log")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=start, args=(cache, log, "k", str(tmp_path / f"m{i}.pt")))
             for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert Path(log).read_text().splitlines() == ["trained"]
    weights = [torch.load(tmp_path / f"m{i}.pt") for i in range(3)]
    assert all(torch.equal(w[k], weights[0][k]) for w in weights[1:] for k in weights[0])
    start(cache, log, "k", str(tmp_path / "later.pt"))       # a later run loads it
    later = torch.load(tmp_path / "later.pt")
    assert all(torch.equal(later[k], weights[0][k]) for k in later)
    assert Path(log).read_text().splitlines() == ["trained"]
    start(cache, log, "other", str(tmp_path / "other.pt"))   # another key trains its own
    assert Path(log).read_text().splitlines() == ["trained", "trained"]
    assert sorted(p.name for p in (tmp_path / "cache").glob("*.safetensors")) == sorted(
        f"toy-{h}.safetensors" for h in (
            __import__("hashlib").sha256(k.encode()).hexdigest()[:16] for k in ("k", "other")))
