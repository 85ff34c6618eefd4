"""StoreWriter: order, completions, merging, drop policy, shutdown, a non-blocking enqueue."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from store_helpers import IDENTITY, make_key, make_payload, read_checkpoint

from histate_vllm.store import SSDStore, StoreWriter


class GatedStore(SSDStore):
    """Writes wait for `gate`, so a test can fill the queue behind a write in flight."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.started = threading.Event()

    def write_chunk(self, *args, **kwargs):
        self.started.set()
        assert self.gate.wait(10)
        return super().write_chunk(*args, **kwargs)

    def publish_checkpoint(self, *args, **kwargs):
        self.started.set()
        assert self.gate.wait(10)
        return super().publish_checkpoint(*args, **kwargs)


@pytest.fixture
def gated(tmp_path) -> GatedStore:
    return GatedStore(tmp_path, IDENTITY, budget_bytes=1 << 30)


C0, C1, C2 = make_key("c0"), make_key("c1"), make_key("c2")
A, B = make_key("A", 1), make_key("B", 1)


def outcomes(writer: StoreWriter) -> list[tuple[bytes, bool, str]]:
    return [(c.key, c.ok, c.reason) for c in writer.drain_finished()]


def test_writes_in_order_and_reports_completions(store):
    w = StoreWriter(store, max_pending_bytes=1 << 20)
    for k in (C0, C1):
        assert w.submit_chunk(k, make_payload(1000, k.hex()), provenance="p")
    assert w.submit_checkpoint(
        A, make_payload(500, "A"), position=1056, chunk_keys=[C0, C1], provenance="p"
    )
    assert w.flush(timeout=10)
    done = w.drain_finished()
    assert [(c.key, c.kind, c.ok) for c in done] == [
        (C0, "chunk", True),
        (C1, "chunk", True),
        (A, "checkpoint", True),
    ]
    assert done[2].nbytes == store.scan().checkpoints[A].nbytes
    assert w.drain_finished() == []
    np.testing.assert_array_equal(read_checkpoint(store, A, 500), make_payload(500, "A"))
    assert w.pending_bytes == 0 and w.stats["written"] == 3
    w.close()


def test_on_done_callback(store):
    seen = []
    w = StoreWriter(store, max_pending_bytes=1 << 20, on_done=lambda *a: seen.append(a))
    w.submit_chunk(C0, make_payload(10, 0), provenance="p")
    w.close()
    assert seen == [(C0, True, "")]
    assert w.drain_finished() == []
    with pytest.raises(RuntimeError, match="closed"):
        w.submit_chunk(C1, make_payload(10, 1), provenance="p")


def test_superseded_checkpoint_is_cancelled_before_it_starts(gated):
    w = StoreWriter(gated, max_pending_bytes=1 << 20)
    w.submit_chunk(C0, make_payload(100, 0), provenance="p")  # blocks the writer
    assert gated.started.wait(5)
    w.submit_checkpoint(A, make_payload(100, "A"), position=528, chunk_keys=[C0], provenance="p")
    w.submit_checkpoint(
        B, make_payload(100, "B"), position=1056, chunk_keys=[C0], provenance="p", supersedes=[A]
    )
    assert w.pending_bytes == 200
    gated.gate.set()
    assert w.flush(timeout=10)
    assert outcomes(w) == [(A, False, "superseded"), (C0, True, ""), (B, True, "")]
    assert not gated.has_checkpoint(A) and gated.has_checkpoint(B)
    w.close()


def test_resubmitted_key_replaces_the_queued_one(gated):
    w = StoreWriter(gated, max_pending_bytes=1 << 20)
    w.submit_chunk(C0, make_payload(100, 0), provenance="p")
    assert gated.started.wait(5)
    w.submit_checkpoint(A, make_payload(100, "old"), position=528, chunk_keys=[C0], provenance="p")
    w.submit_checkpoint(A, make_payload(100, "new"), position=528, chunk_keys=[C0], provenance="p")
    gated.gate.set()
    w.close()
    assert [ok for _, ok, _ in outcomes(w)] == [False, True, True]
    np.testing.assert_array_equal(read_checkpoint(gated, A, 100), make_payload(100, "new"))


def test_duplicate_chunk_rides_on_the_queued_write(gated):
    w = StoreWriter(gated, max_pending_bytes=1 << 20)
    w.submit_chunk(C0, make_payload(100, 0), provenance="p")
    assert gated.started.wait(5)
    w.submit_chunk(C1, make_payload(100, 1), provenance="p")
    w.submit_chunk(C1, make_payload(100, 1), provenance="p")
    assert w.pending_bytes == 200
    gated.gate.set()
    w.close()
    assert outcomes(w) == [(C0, True, ""), (C1, True, ""), (C1, True, "")]


def test_drop_policy_rejects_newest_when_full(gated):
    w = StoreWriter(gated, max_pending_bytes=1000)
    assert w.submit_chunk(C0, make_payload(600, 0), provenance="p")  # in flight, counted
    assert gated.started.wait(5)
    assert w.submit_chunk(C1, make_payload(400, 1), provenance="p")  # exactly full
    assert not w.submit_chunk(C2, make_payload(1, 2), provenance="p")
    assert not w.submit_checkpoint(
        A, make_payload(10, "A"), position=1, chunk_keys=[C2], provenance="p"
    )
    assert outcomes(w) == [(C2, False, "queue full"), (A, False, "queue full")]
    gated.gate.set()
    assert w.flush(timeout=10)
    assert [ok for _, ok, _ in outcomes(w)] == [True, True]
    # Room again; but a checkpoint over a chunk this writer dropped is never published.
    assert w.submit_checkpoint(
        A, make_payload(10, "A"), position=1, chunk_keys=[C2], provenance="p"
    )
    w.close()
    [(key, ok, reason)] = outcomes(w)
    assert key == A and not ok and "not written" in reason
    assert w.stats["rejected"] == 2


def test_oversize_item_accepted_only_into_an_empty_queue(gated):
    w = StoreWriter(gated, max_pending_bytes=100)
    assert w.submit_chunk(C0, make_payload(500, 0), provenance="p")
    assert gated.started.wait(5)
    assert not w.submit_chunk(C1, make_payload(500, 1), provenance="p")
    gated.gate.set()
    w.close()


def test_superseding_never_loses_both(gated):
    """A supersede that does not fit keeps the old checkpoint queued."""
    w = StoreWriter(gated, max_pending_bytes=300)
    w.submit_chunk(C0, make_payload(100, 0), provenance="p")
    assert gated.started.wait(5)
    w.submit_checkpoint(A, make_payload(100, "A"), position=1, chunk_keys=[C0], provenance="p")
    assert not w.submit_checkpoint(
        B, make_payload(250, "B"), position=2, chunk_keys=[C0], provenance="p", supersedes=[A]
    )
    gated.gate.set()
    w.close()
    assert gated.has_checkpoint(A) and not gated.has_checkpoint(B)


def test_close_without_drain_cancels_queued_writes(gated):
    # One I/O thread, so that C1 stays queued behind C0 in flight.
    w = StoreWriter(gated, max_pending_bytes=1 << 20, io_threads=1)
    w.submit_chunk(C0, make_payload(100, 0), provenance="p")
    assert gated.started.wait(5)
    w.submit_chunk(C1, make_payload(100, 1), provenance="p")
    threading.Timer(0.1, gated.gate.set).start()
    w.close(drain=False)
    assert outcomes(w) == [(C1, False, "writer closed"), (C0, True, "")]


class FirstChunkGated(SSDStore):
    """Only the write of `slow` waits for `gate`; the others go straight through."""

    def __init__(self, *args, slow, **kwargs):
        super().__init__(*args, **kwargs)
        self.slow = slow
        self.gate = threading.Event()
        self.published = threading.Event()

    def write_chunk(self, key, *args, **kwargs):
        if key == self.slow:
            assert self.gate.wait(10)
        return super().write_chunk(key, *args, **kwargs)

    def publish_checkpoint(self, *args, **kwargs):
        self.published.set()
        return super().publish_checkpoint(*args, **kwargs)


def test_chunk_writes_overlap_yet_report_and_publish_in_order(tmp_path):
    store = FirstChunkGated(tmp_path, IDENTITY, budget_bytes=1 << 30, slow=C0)
    w = StoreWriter(store, max_pending_bytes=1 << 20, io_threads=4)
    w.submit_chunk(C0, make_payload(100, 0), provenance="p")  # held at the gate
    w.submit_chunk(C1, make_payload(100, 1), provenance="p")
    w.submit_checkpoint(A, make_payload(50, "A"), position=1056, chunk_keys=[C0, C1],
                        provenance="p")
    w.submit_chunk(C2, make_payload(100, 2), provenance="p")  # after the checkpoint
    deadline = time.monotonic() + 10
    while not store.has_chunk(C2) and time.monotonic() < deadline:
        time.sleep(0.01)
    # Written while C0 is still in flight, C2 without waiting for the checkpoint.
    assert store.has_chunk(C1) and store.has_chunk(C2)
    # Completions wait for C0's, and the checkpoint for both of its chunks.
    assert outcomes(w) == [] and not store.published.is_set()
    store.gate.set()
    assert w.flush(timeout=10)
    assert outcomes(w) == [(C0, True, ""), (C1, True, ""), (A, True, ""), (C2, True, "")]
    assert store.has_checkpoint(A)
    w.close()


def test_submits_never_wait_for_the_disk_or_copy_the_payload(gated):
    """The engine thread's side of a write is a queue append: with every writer
    blocked inside a write, a step's worth of chunks and a 64 MiB state are still
    accepted at once, by reference. (Enqueue latency: benchmarks/bench_store.py.)"""
    state = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8)
    chunk = make_payload(256 << 10, "chunk")
    w = StoreWriter(gated, max_pending_bytes=1 << 30)
    keys = [make_key(f"lat-c{j}") for j in range(40)]
    accepted: list[bool] = []

    def engine_step():
        accepted.extend(w.submit_chunk(k, chunk, provenance="p") for k in keys)
        accepted.append(w.submit_checkpoint(
            make_key("lat-s", 1), state, position=1, chunk_keys=keys, provenance="p"
        ))

    assert w.submit_chunk(make_key("first"), chunk, provenance="p")
    assert gated.started.wait(10)  # a writer now holds a write open
    step = threading.Thread(target=engine_step)
    step.start()
    step.join(30)  # liveness only: a submit that waited on the gate never returns
    assert not step.is_alive() and accepted == [True] * 41
    assert not gated.has_checkpoint(make_key("lat-s", 1))
    queued = w._queued_ckpt[make_key("lat-s", 1)]
    assert np.shares_memory(np.frombuffer(queued.payload, np.uint8), state)
    gated.gate.set()
    assert w.flush(timeout=120)
    assert all(c.ok for c in w.drain_finished())
    np.testing.assert_array_equal(read_checkpoint(gated, make_key("lat-s", 1), state.size), state)
    w.close()


def test_wait_finished_returns_when_a_write_lands_not_before(gated):
    """An idle engine's step waits here for a completion instead of spinning."""
    w = StoreWriter(gated, max_pending_bytes=1 << 20)
    assert w.wait_finished(0.0)  # nothing queued: no wait
    w.submit_chunk(C0, make_payload(10, 0), provenance="p")
    assert gated.started.wait(10)
    assert not w.wait_finished(0.05)  # the write is held at the gate
    gated.gate.set()
    assert w.wait_finished(10)
    assert outcomes(w) == [(C0, True, "")]
    w.close()


def test_idle_only_once_every_outcome_is_drained(gated):
    """The offline runner's `settle` waits on this: a write queued, running, or landed but
    not yet reported to the scheduler is SSD work still going on."""
    w = StoreWriter(gated, max_pending_bytes=1 << 20)
    assert w.idle()
    w.submit_chunk(C0, make_payload(10, 0), provenance="p")
    assert gated.started.wait(10)
    assert not w.idle()  # running
    gated.gate.set()
    assert w.flush(timeout=10)
    assert not w.idle()  # landed, its outcome not drained
    assert outcomes(w) == [(C0, True, "")]
    assert w.idle()
    w.close()
