"""A collective that failed because another rank died or hung, turned into one clear line.

gloo reports "Timed out waiting Nms for recv" or "Connection closed by peer", NCCL's watchdog
"Watchdog caught collective operation timeout"; either way the cause is usually on another rank,
whose own log holds the real error. Every caller (LeNet data-parallel loop, GPT engine) uses this.
"""

from __future__ import annotations

import torch.distributed as dist

from trainlab.errors import HardwareError


class PeerFailure(HardwareError):
    """This rank's collective failed because of another rank: the launcher prefers that rank's cause."""


PEER_FAILURE_MARKERS = (
    "gloo",
    "nccl",
    "connection",
    "timed out",
    "timeout",
    "peer",
    "socket",
    "broken pipe",
    "communicator was aborted",
    "watchdog",
)


def raise_if_peer_failure(exc: BaseException, rank: int, world_size: int, timeout_s: float) -> None:
    """Re-raise `exc` as a one-line HardwareError if it is a failed collective (the caller re-raises
    anything else). Does nothing in a world of one."""
    if world_size == 1 or not isinstance(exc, RuntimeError):  # dist.DistError is a RuntimeError
        return
    text = str(exc)
    if isinstance(exc, dist.DistError) or any(m in text.lower() for m in PEER_FAILURE_MARKERS):
        lines = text.strip().splitlines()
        first = lines[-1].strip()[:200] if lines else type(exc).__name__
        raise PeerFailure(
            f"rank {rank}/{world_size}: a collective failed: another rank died or stalled longer than the "
            f"{timeout_s:g} s process-group timeout (another rank crashed, was killed or hung; its own log has the "
            f"cause; --dist-timeout sets the timeout): {first}"
        ) from exc
