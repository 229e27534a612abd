"""SIGTERM and SIGINT end a run cleanly: at the next epoch boundary, with a checkpoint `--resume` continues.

A scheduler's SIGTERM (a batch system's time limit, `timeout`, a lab step's budget) or a Ctrl-C used to
kill the run mid-epoch: everything since the last checkpoint was lost, and a run killed before its
first epoch ended left nothing to resume. Now the training loop runs inside `StopOnSignal`: the first
SIGTERM or SIGINT only sets a flag (and says so on stderr); the loop looks at it after each epoch's
checkpoint is written and then raises `RunStopped`, one line naming the signal and the `--resume`
command, exit code 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM). A second signal acts
at once, as without the handler (the last checkpoint stays). Under data parallelism every rank stops
at the same epoch: the ranks agree by summing their flags (one all-reduce of one number per epoch).

Not in the workers of trainlab's own launcher (`train --nproc N`, `distributed.launch`): there the
elastic agent owns the ranks' lifetime, and its SIGTERM is its clean-up after a failed or stopped rank
(or after SIGTERM/Ctrl-C to the launcher itself). A rank that caught it would run on to the end of its
epoch, the agent would SIGKILL it, and the launcher could no longer say which rank hung. There the
last epoch's checkpoint is what `--resume` continues from.

A command that waits on launched processes (`distributed.launch.run_limited`: a `gpt ablation` or
`gpt compare` row, a `dp compare` mode) waits inside `stop_children_on_signal`: SIGTERM raises
`RunStopped` there (Ctrl-C raises KeyboardInterrupt as always), the waiting code stops the child's whole
tree on its way out, and the rows written so far stay for the resumed call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from trainlab.errors import UserError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
LAUNCHER_ENV = "TRAINLAB_LAUNCHER"  # set for the workers of `distributed.launch.launch_workers` (its launch folder)


class RunStopped(UserError):
    """A run stopped by a signal, after writing its checkpoint."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopOnSignal:
    """A context in which SIGTERM/SIGINT set `self.signum` instead of killing the process."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopOnSignal:
        if os.environ.get(LAUNCHER_ENV):  # a worker of our launcher: the agent's SIGTERM ends it (docstring)
            return self
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame) -> None:
        if self.signum is not None:  # the second signal: act as if no handler were installed
            self.__exit__()
            signal.raise_signal(signum) if signum != signal.SIGINT else _interrupt()
            return
        self.signum = signum
        print(
            f"trainlab: {signal.Signals(signum).name} received: stopping after this epoch's checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def agreed(self, par=None) -> int | None:
        """The signal that stops the run, agreed by every rank (any rank's flag stops them all), or None."""
        signum = self.signum or 0
        if par is not None and par.multi_process:
            import torch

            flag = torch.tensor([float(signum)], device=par.device if par.device.type == "cuda" else "cpu")
            signum = int(par.sum_(flag).item())
            signum = signum if signum in tuple(SIGNALS) else (signal.SIGTERM if signum else 0)
        return signum or None

    def stop(self, par, run_dir, epochs_done: int, epochs: int) -> None:
        """At an epoch boundary, after the checkpoint: raise `RunStopped` if a signal asked for it."""
        signum = self.agreed(par)
        if signum is not None and epochs_done < epochs:
            raise RunStopped(
                f"stopped by {signal.Signals(signum).name} after epoch {epochs_done} of {epochs}; "
                f"its checkpoint is saved: continue with `trainlab train --resume {run_dir}`",
                signum,
            )


@contextlib.contextmanager
def stop_children_on_signal():
    """While launched children run: SIGTERM raises `RunStopped` (exit 143) in this, the main, thread, so
    the code that started them stops them on its way out (without a handler SIGTERM ends this process at
    once and the children run on)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame) -> None:
        signal.signal(signum, previous)  # a second SIGTERM acts at once
        raise RunStopped(
            f"stopped by {signal.Signals(signum).name}: the running worker processes were stopped; "
            "what finished before is kept (run the same command again to continue)",
            signum,
        )

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt():
    raise KeyboardInterrupt
