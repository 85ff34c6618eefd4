"""Background threads move to the spare cores and write-side ones yield (store/threads.py)."""

from __future__ import annotations

import os
import threading

import pytest

from histate_vllm.store import threads

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


@pytest.fixture
def placed():
    """Place background threads on one core of this process's, then undo it."""
    cpu = max(os.sched_getaffinity(0))
    threads.place_background({cpu})
    yield cpu
    threads.place_background(None, write_nice=0)


def _seen_by(start) -> dict:
    seen: dict = {}

    def probe():
        seen["cpus"] = os.sched_getaffinity(0)
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen["comm"] = f.read().strip()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    start(probe)
    return seen


def test_threads_start_on_the_spare_cores_and_writers_yield(placed):
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    w = _seen_by(lambda f: threads.start_thread(f, name="t-write", writes=True).join())
    r = _seen_by(lambda f: threads.start_thread(f, name="t-read", writes=False).join())
    assert w["cpus"] == r["cpus"] == {placed}
    assert w["nice"] == min(19, base + threads.WRITE_NICE)
    assert r["nice"] == base
    assert (w["comm"], r["comm"]) == ("t-write", "t-read")  # visible in top -H, py-spy


def test_pool_threads_enter_the_placement(placed):
    with threads.executor(2, "t-pool", writes=True) as pool:
        got = pool.submit(os.sched_getaffinity, 0).result()
    assert got == {placed}


def test_unplaced_threads_inherit_the_binding():
    threads.place_background(None, write_nice=0)
    before = os.sched_getaffinity(0)
    seen = _seen_by(lambda f: threads.start_thread(f, name="t", writes=True).join())
    assert seen["cpus"] == before
    assert seen["nice"] == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
