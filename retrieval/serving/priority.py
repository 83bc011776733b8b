"""CPU priority of the server's compute threads: the doors' event loop first.

On a saturated machine the event loop competes for the cores with the model and index threads. Every call it
takes (admitted or refused) waits for a core, so refusals that should be instant queue behind the very compute
they protect. Raising the compute threads' nice value (Linux: per thread, inherited by the threads they create)
gives the loop, and gRPC's own polling threads, the cores first whenever it has work; the compute still has
every idle cycle. ``[server] compute_nice`` (0 = off). Lowering priority needs no privilege.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

TASKS = Path("/proc/self/task")


def thread_ids() -> set[int]:
    """The native ids of this process's threads (empty where /proc is absent: then nothing is reniced)."""
    try:
        return {int(t) for t in os.listdir(TASKS)}
    except OSError:
        return set()


def compute_threads(tids: set[int]) -> set[int]:
    """Those of ``tids`` that run our code or a model's: named like the main thread (Python's threads, and ONNX
    Runtime's and OpenMP's, which do not rename themselves). gRPC's C-core names its own threads
    (``event_engine``, ``grpc_global_tim``, ...): they poll the sockets and keep their priority."""
    try:
        main = (TASKS / str(os.getpid()) / "comm").read_text()
    except OSError:
        return set()
    out = set()
    for tid in tids:
        try:
            if (TASKS / str(tid) / "comm").read_text() == main:
                out.add(tid)
        except OSError:
            continue
    return out


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def lower_priority(tids: set[int], nice: int) -> int:
    """Set each thread's nice value to ``nice`` (never lower than it is); returns how many were changed."""
    changed = 0
    for tid in tids:
        try:
            if nice_of(tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except (ProcessLookupError, PermissionError) as e:  # the thread ended, or a platform says no
            log.debug("could not renice thread %d: %s", tid, e)
    return changed
