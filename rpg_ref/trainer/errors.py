"""The ways a run ends with one line instead of a traceback, and the words they share.

Each is raised where the fault is found and turned into its line and exit code in one place,
rpg-train's ``main`` (rpg_ref/cli.py):

    FolderBusy    another rpg-train holds the run folder                      exit 2
    ResumeError   a run folder that cannot be continued as it is              exit 2
    DiskFull      no space left for a checkpoint                              exit 1
    Diverged      training produced non-finite values                         exit 1
    Interrupted   SIGTERM, raised like Ctrl-C's KeyboardInterrupt             exit 128 + signal

They live at the bottom of the trainer (docs/architecture.md) so that any layer may raise them.
"""

from __future__ import annotations


class FolderBusy(ValueError):
    """Another process holds the run folder's lock."""


class ResumeError(ValueError):
    """A run folder that cannot be continued as it is (one line naming the file)."""


class DiskFull(OSError):
    """No space left for a checkpoint (one line naming the folder and the bytes needed)."""

    def __str__(self) -> str:
        return str(self.strerror)


class Diverged(RuntimeError):
    """Training produced non-finite values: the run stops (one line naming the step and flags)."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that both end a run the same way."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def flag_advice(cfg) -> str:
    """The flags that most often make a run diverge, with their values."""
    clip = "" if cfg.grad_clip > 0 else f" or set --grad-clip > 0 (now {cfg.grad_clip:g}: off)"
    return f"lower --lr (now {cfg.lr:g}){clip}"


def exploitation_advice(cfg) -> str:
    """What holds back a policy that exploits its reward, with the flags' values."""
    kl = (f"a KL term to the start (--ref init and --beta > 0; now --ref {cfg.ref}, --beta "
          f"{cfg.beta:g})" if cfg.ref != "init" or not cfg.beta else
          f"a larger --beta (now {cfg.beta:g})")
    k = cfg.updates_per_step or cfg.prompts_per_step * cfg.group_size // cfg.mini_batch_size
    fewer = f" or fewer updates per batch (now {k}: --updates-per-step)" if k > 1 else ""
    return f"add {kl}{fewer}"
