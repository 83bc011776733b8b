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
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def nice_self(nice: int) -> None:
    """Raise the calling thread's nice value to ``nice`` (Linux: per thread; the threads it creates inherit it)."""
    tid = threading.get_native_id()
    try:
        if nice_of(tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (ProcessLookupError, PermissionError, OSError) as e:
        log.debug("could not renice thread %d: %s", tid, e)


def run_niced(nice: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a fresh thread at ``nice`` (blocking until it returns). Whatever threads ``fn`` creates
    (ONNX Runtime's and OpenMP's pools, made when the models load) inherit that priority; nothing else in the
    process is touched, gRPC's own threads included."""
    out: list[Any] = []

    def body() -> None:
        nice_self(nice)
        try:
            out.append((True, fn(*args)))
        except BaseException as e:  # re-raised on the caller's thread
            out.append((False, e))

    t = threading.Thread(target=body, name="hybridrag-load")
    t.start()
    t.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value
