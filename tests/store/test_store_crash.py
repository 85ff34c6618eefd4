"""A writer process killed with SIGKILL at random points, and at every system call of a
publish: a restart must list only complete checkpoints whose bytes are exactly what
their run computed, and after the garbage pass no file is left that no manifest names.

Payload bytes are a function of (key, provenance), so a restored checkpoint and each of
its chunks can be checked byte for byte against the run that wrote them.
"""

from __future__ import annotations

import os
import random
import signal
import time
import traceback

import numpy as np
import pytest
from store_helpers import IDENTITY, assert_only_published_files, make_key, make_payload

from histate_vllm.store import SSDStore, StoreError
from histate_vllm.store.reader import peek_header
from histate_vllm.store.sysio import SYS

CHUNK_POOL = [make_key(f"c{i}") for i in range(24)]
CKPT_POOL = [make_key(f"k{i}", 1) for i in range(12)]
RANDOM_TRIALS = 200


def chunk_bytes(key: bytes, provenance: str) -> np.ndarray:
    return make_payload(1000 + key[0] * 300 + len(provenance), key.hex() + provenance)


def state_bytes(key: bytes, provenance: str) -> np.ndarray:
    return make_payload(2000 + key[1] * 200 + len(provenance), key.hex() + provenance)


def open_store(root) -> SSDStore:
    return SSDStore(root, IDENTITY, budget_bytes=1 << 40)


def publish(store: SSDStore, key: bytes, chunks: list[bytes], prov: str) -> None:
    for ck in chunks:
        if not store.has_chunk(ck):
            store.write_chunk(ck, chunk_bytes(ck, prov), provenance=prov)
    store.publish_checkpoint(
        key,
        state_bytes(key, prov),
        position=CKPT_POOL.index(key) * 528,
        chunk_keys=chunks,
        provenance=prov,
    )


def writer_loop(root, seed: int, tick) -> None:
    """An engine worker plus an evicting scheduler, as fast as they go, forever.

    Evicts like a real policy: a chunk only once no checkpoint references it.
    (What a restore does when a referenced chunk is deleted and rewritten with other
    bytes is tested in test_store_corruption.)
    """
    store = open_store(root)
    refs = {k: set(info.chunk_keys) for k, info in store.scan().checkpoints.items()}
    rng = random.Random(seed)
    n = 0
    while True:
        tick()  # one byte to the parent per operation started
        n += 1
        prov = f"run{seed}-{n}"
        r = rng.random()
        try:
            if r < 0.55:
                key, chunks = rng.choice(CKPT_POOL), rng.sample(CHUNK_POOL, rng.randint(1, 4))
                refs[key] = set(chunks)  # before: a failed replace may have unlisted it
                publish(store, key, chunks, prov)
            elif r < 0.7:
                key = rng.choice(CKPT_POOL)
                store.delete_checkpoint(key)
                refs.pop(key, None)
            elif r < 0.8:
                ck = rng.choice(CHUNK_POOL)
                if not any(ck in used for used in refs.values()):
                    store.delete_chunk(ck)
            else:
                ck = rng.choice(CHUNK_POOL)
                if not store.has_chunk(ck):
                    store.write_chunk(ck, chunk_bytes(ck, prov), provenance=prov)
        except StoreError:
            pass


def run_child(fn, *args) -> None:
    """Run `fn` in a forked child and exit: 0 if it returned, 1 if it raised."""
    code = 1
    try:
        fn(*args)
        code = 0
    except BaseException:  # noqa: BLE001 - report anything, then exit the child
        traceback.print_exc()
    finally:
        os._exit(code)


def fork(fn, *args, ticks: int = 1) -> tuple[int, int]:
    """Fork a child running fn(*args, tick); return (pid, pipe) once it ticked `ticks`
    times. Close the pipe only after the child is gone (a tick into a closed pipe
    raises in the child).

    Counting the child's progress, not sleeping, decides where the kill lands, so a
    loaded machine (a slow child) moves the kill in time but not in the work done.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        os.close(r)
        run_child(fn, *args, lambda: os.write(w, b"x"))
    os.close(w)
    for _ in range(ticks):
        assert os.read(r, 1) == b"x"
    return pid, r


def kill(pid: int, pipe: int) -> None:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(pipe)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def verify_restart(root) -> int:
    """Restart, restore every listed checkpoint exactly, collect garbage; return count."""
    store = open_store(root)
    index = store.scan()
    for key, info in index.checkpoints.items():
        out = np.empty(info.state_nbytes, np.uint8)
        store.read_checkpoint(key, out)  # raises if anything is corrupt: a test failure
        np.testing.assert_array_equal(out, state_bytes(key, info.provenance))
        for ck in info.chunk_keys:
            h, _ = peek_header(store.layout.chunk_path(ck))
            out = np.empty(h.nbytes, np.uint8)
            store.read_chunk(ck, out)
            np.testing.assert_array_equal(out, chunk_bytes(ck, h.provenance))
    store.collect_garbage(grace_s=0)
    assert_only_published_files(store)
    assert len(store.scan().checkpoints) == len(index.checkpoints)
    return len(index.checkpoints)


def test_sigkill_at_random_points(tmp_path):
    rng = random.Random(1234)
    root = tmp_path / "store"
    seen = 0
    for trial in range(RANDOM_TRIALS):
        pid, pipe = fork(writer_loop, root, trial, ticks=rng.randint(1, 12))
        time.sleep(rng.uniform(0, 0.003))  # then anywhere inside the next operation(s)
        kill(pid, pipe)
        seen += verify_restart(root)
    assert seen > 3 * RANDOM_TRIALS, "the writer should have published checkpoints"


def _kill_at_step(step: int, root, job) -> None:
    calls = [0]

    def wrap(orig):
        def call(*args, **kwargs):
            if calls[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            calls[0] += 1
            return orig(*args, **kwargs)

        return call

    for name in ("open", "write", "fsync", "close", "rename", "unlink", "mkdir"):
        setattr(SYS, name, wrap(getattr(SYS, name)))
    job(open_store(root))


OLD = make_key("k0", 1)


def _setup(root) -> None:
    publish(open_store(root), OLD, CHUNK_POOL[:2], "old")


JOBS = {
    "new checkpoint with new chunks": lambda s: publish(s, CKPT_POOL[1], CHUNK_POOL[1:4], "new"),
    "replace a checkpoint": lambda s: publish(s, OLD, CHUNK_POOL[2:4], "new"),
    "delete a checkpoint": lambda s: s.delete_checkpoint(OLD),
}


@pytest.mark.parametrize("job", list(JOBS))
def test_sigkill_at_every_step(tmp_path, job):
    for step in range(200):
        root = tmp_path / f"s{step}"
        _setup(root)
        pid = os.fork()
        if pid == 0:
            run_child(_kill_at_step, step, root, JOBS[job])
        _, status = os.waitpid(pid, 0)
        finished = os.WIFEXITED(status)
        assert not finished or os.WEXITSTATUS(status) == 0, "the job raised"
        store = open_store(root)
        listed = store.scan().checkpoints
        if OLD in listed:  # the old checkpoint or its whole replacement
            assert listed[OLD].provenance in ("old", "new")
        verify_restart(root)
        if finished:
            assert step > 3, "the kill must have landed inside the job first"
            break
    else:
        pytest.fail("the job never finished within 200 steps")


def test_two_processes_share_a_store(tmp_path):
    """A worker publishes while the scheduler scans and collects garbage."""
    root = tmp_path / "store"
    keys = [make_key(f"two{i}", 1) for i in range(30)]

    def worker(tick) -> None:
        tick()
        s = open_store(root)
        for i, k in enumerate(keys):
            ck = make_key(f"twochunk{i}")
            s.write_chunk(ck, chunk_bytes(ck, "w"), provenance="w")
            s.publish_checkpoint(
                k, state_bytes(k, "w"), position=i, chunk_keys=[ck], provenance="w"
            )

    scheduler = open_store(root)
    pid, pipe = fork(worker)
    done = False
    status = 0
    while not done:
        scheduler.scan()
        scheduler.collect_garbage()  # default grace: must not touch in-flight writes
        waited, status = os.waitpid(pid, os.WNOHANG)
        done = waited == pid
    os.close(pipe)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert set(scheduler.scan().checkpoints) == set(keys)
    assert verify_restart(root) == len(keys)
