"""The worker's copy ordering, on a CPU, with a fake transfer stream that copies only when
the test lets it (as a busy GPU would): a job is reported done only once its copy has run,
a copy waits for the compute stream's work, an SSD write waits for the store filling its
slot, a failed restore waits for the copies it queued, and SSD reads run in parallel while
earlier keys are copied."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))
from store_helpers import IDENTITY, make_key, make_payload  # noqa: E402

from histate_vllm.store import SSDStore  # noqa: E402
from histate_vllm.vllm_glue.transfer_specs import (  # noqa: E402
    HiStateLoadSpec,
    HiStateStoreSpec,
    SSDDelete,
    SSDWrite,
)
from histate_vllm.vllm_glue.worker import HiStateWorker  # noqa: E402
from tests.datapath.test_copier import (  # noqa: E402
    KEY_BYTES,
    NUM_BLOCKS,
    PAGES,
    fill_block,
    key_bytes_of,
)


class FakeEvent:
    def __init__(self, stream):
        self.stream = stream
        self.fired = False

    def query(self) -> bool:
        return self.fired

    def synchronize(self) -> None:
        self.stream.run_until(self)

    def seconds(self):
        return 0.25 if self.fired else None  # what a device's timing events would say


class FakeStream:
    """Queues launched copies; `run()` (or synchronizing an event) runs them in order."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log
        self.pending: deque = deque()
        self.lock = threading.RLock()

    def mark_compute(self):
        mark = FakeEvent(self)
        mark.fired = True
        self.log.append(("mark", self.name, id(mark)))
        return mark

    def launch(self, fn, after=None):
        with self.lock:
            end = FakeEvent(self)
            self.log.append(("launch", self.name, id(after)))
            self.pending.append((fn, end))
            return end

    def run_until(self, event=None) -> None:
        with self.lock:
            while self.pending and not (event is not None and event.fired):
                fn, end = self.pending.popleft()
                fn()
                end.fired = True

    run = run_until


def make_worker(store=None, **kw):
    caches = [torch.zeros((NUM_BLOCKS, PAGES[0]), dtype=torch.int8),
              torch.zeros((NUM_BLOCKS, PAGES[1] + 64), dtype=torch.int8)[:, :PAGES[1]]]
    kv = SimpleNamespace(
        tensors=[SimpleNamespace(tensor=t, page_size_bytes=n) for t, n in zip(caches, PAGES)],
        group_data_refs=[[SimpleNamespace(tensor_idx=i, page_size_bytes=n)
                          for i, n in enumerate(PAGES)]],
    )
    log: list = []
    streams = (FakeStream("store", log), FakeStream("load", log))
    w = HiStateWorker(kv, key_bytes=KEY_BYTES, num_slots=8, store=store,
                      ssd_queue_bytes=1 << 20, streams=streams, **kw)
    return w, caches, streams, log


def gpu_spec(block_ids):
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    return GPULoadStoreSpec(block_ids, group_sizes=[len(block_ids)], block_indices=[0])


def finished(w):
    return [(r.job_id, r.success) for r in w.get_finished()]


def test_store_is_done_only_when_its_copy_has_run():
    w, caches, (store_s, _), log = make_worker()
    payload = make_payload(KEY_BYTES, "a")
    fill_block(caches, 5, payload)
    w.submit_store(1, gpu_spec([5]), HiStateStoreSpec(slots=[3]))
    # Ordered after the compute stream's work at submit time.
    assert log == [("mark", "store", log[0][2]), ("launch", "store", log[0][2])]
    assert finished(w) == [] and not w.dram[3].any()
    store_s.run()
    [result] = w.get_finished()
    assert (result.job_id, result.success) == (1, True)
    # The copy's own time from the stream's events, not the time since submit.
    assert result.transfer_time == 0.25 and result.transfer_size == KEY_BYTES
    np.testing.assert_array_equal(w.dram[3].numpy().view(np.uint8), payload)
    w.shutdown()


def test_dram_load_is_done_only_when_its_copy_has_run_and_wait_blocks_on_it():
    w, caches, _, log = make_worker()
    for slot, seed in ((2, "x"), (6, "y")):
        w.dram[slot] = torch.from_numpy(make_payload(KEY_BYTES, seed).view(np.int8))
    w.submit_load(7, HiStateLoadSpec(slots=[2, 6], keys=[b"x", b"y"], is_state=[False] * 2),
                  gpu_spec([9, 4]))
    assert [e[:2] for e in log] == [("mark", "load"), ("launch", "load")]
    assert finished(w) == [] and not caches[0][9].any()
    w.wait({7})  # vLLM reuses the blocks after this
    np.testing.assert_array_equal(key_bytes_of(caches, 9), make_payload(KEY_BYTES, "x"))
    np.testing.assert_array_equal(key_bytes_of(caches, 4), make_payload(KEY_BYTES, "y"))
    assert finished(w) == [(7, True)]
    w.shutdown()


def test_ssd_write_waits_for_the_store_filling_its_slot_and_keeps_order(tmp_path):
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    k, old = make_key("k"), make_key("old")
    store.write_chunk(old, make_payload(100, "old"), provenance="p")
    w, caches, (store_s, _), _ = make_worker(store)
    payload = make_payload(KEY_BYTES, "k")
    fill_block(caches, 1, payload)
    w.submit_store(1, gpu_spec([1]), HiStateStoreSpec(slots=[0]))
    w.submit_ssd_writes([SSDWrite(key=k, slot=0, is_state=False, position=256),
                         SSDDelete(old, False)])
    w.get_finished()
    assert w.writer.flush(timeout=10)
    assert not store.has_chunk(k) and store.has_chunk(old)  # both held back, in order
    store_s.run()
    assert finished(w) == [(1, True)]  # ... which passes them on
    assert w.writer.flush(timeout=10)
    out = np.empty(KEY_BYTES, np.uint8)
    store.read_chunk(k, out)
    np.testing.assert_array_equal(out, payload)
    assert not store.has_chunk(old)
    w.shutdown()


class SlowStore(SSDStore):
    """Reads take a while and record how many run at once."""

    def __init__(self, *a, delay=0.05, missing=(), **k):
        super().__init__(*a, **k)
        self.delay, self.missing = delay, set(missing)
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.events: list = []

    def read_chunk(self, key, out):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.delay)
        try:
            if key in self.missing:
                self.delete_chunk(key)
            return super().read_chunk(key, out)
        finally:
            with self.lock:
                self.running -= 1
                self.events.append(("read", key))


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_ssd_reads_run_in_parallel_and_overlap_the_copies(tmp_path):
    store = SlowStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    keys = [make_key(i) for i in range(10)]
    for i, k in enumerate(keys):
        store.write_chunk(k, make_payload(KEY_BYTES, i), provenance="p")
    w, caches, (_, load_s), log = make_worker(store, read_ahead=3)
    dram = make_payload(KEY_BYTES, "dram")
    w.dram[4] = torch.from_numpy(dram.view(np.int8))
    blocks = list(range(2, 13))
    spec = HiStateLoadSpec(slots=[4] + [-1] * 10, keys=[b"d", *keys], is_state=[False] * 11)
    orig_launch = load_s.launch

    def launch(fn, after=None):  # note each copy among the reads
        with store.lock:
            store.events.append(("copy", None))
        return orig_launch(fn, after)

    load_s.launch = launch
    w.submit_load(3, spec, gpu_spec(blocks))
    wait_for(lambda: w._loads[3].future.done())
    assert finished(w) == []  # every read is over, but the copies have not run
    load_s.run()
    assert finished(w) == [(3, True)]
    assert store.most == 3  # read_ahead reads at once
    kinds = [e[0] for e in store.events]
    assert kinds[0] == "copy"  # the DRAM key, in one batch before any read
    first_ssd_copy = kinds.index("copy", 1)
    assert first_ssd_copy < len(kinds) - 1 - kinds[::-1].index("read")  # overlaps the reads
    assert kinds.count("copy") == 11
    np.testing.assert_array_equal(key_bytes_of(caches, 2), dram)
    for i, b in enumerate(blocks[1:]):
        np.testing.assert_array_equal(key_bytes_of(caches, b), make_payload(KEY_BYTES, i))
    # Every copy of the job waits for the compute stream's work at submit time.
    marks = [e[2] for e in log if e[0] == "mark"]
    assert marks and all(e[2] == marks[0] for e in log if e[0] == "launch")
    w.shutdown()


def test_failed_restore_is_reported_after_the_copies_it_queued(tmp_path):
    store = SlowStore(tmp_path, IDENTITY, budget_bytes=1 << 30, delay=0.0)
    good, bad = make_key("good"), make_key("bad")
    for k in (good, bad):
        store.write_chunk(k, make_payload(KEY_BYTES, k.hex()), provenance="p")
    store.missing.add(bad)
    w, caches, (_, load_s), _ = make_worker(store, read_ahead=1)
    spec = HiStateLoadSpec(slots=[-1, -1], keys=[good, bad], is_state=[False, False])
    w.submit_load(4, spec, gpu_spec([6, 7]))
    wait_for(lambda: w._loads[4].future.done())
    assert finished(w) == []  # good's copy is still queued into block 6
    load_s.run()
    assert finished(w) == [(4, False)]
    assert bad in w.ssd_lost
    w.shutdown()


def test_next_restore_never_refills_a_staging_row_still_being_copied(tmp_path):
    store = SlowStore(tmp_path, IDENTITY, budget_bytes=1 << 30, delay=0.0)
    keys = [make_key(f"r{i}") for i in range(4)]
    for i, k in enumerate(keys):
        store.write_chunk(k, make_payload(KEY_BYTES, i), provenance="p")
    w, caches, (_, load_s), _ = make_worker(store, read_ahead=1)  # a ring of 2 rows
    w.submit_load(1, HiStateLoadSpec(slots=[-1, -1], keys=keys[:2], is_state=[False] * 2),
                  gpu_spec([1, 2]))
    wait_for(lambda: w._loads[1].future.done())
    # Job 1's copies out of both rows have not run; job 2 reads into the same rows.
    w.submit_load(2, HiStateLoadSpec(slots=[-1, -1], keys=keys[2:], is_state=[False] * 2),
                  gpu_spec([3, 4]))
    wait_for(lambda: w._loads[2].future.done())
    load_s.run()
    assert sorted(finished(w)) == [(1, True), (2, True)]
    for i, b in enumerate([1, 2, 3, 4]):
        np.testing.assert_array_equal(key_bytes_of(caches, b), make_payload(KEY_BYTES, i))
    w.shutdown()


class GatedWrites(SSDStore):
    """Chunk writes wait at a gate: a writer busy with backups."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.gate = threading.Event()

    def write_chunk(self, *a, **k):
        self.gate.wait(30)
        return super().write_chunk(*a, **k)


def test_an_idle_step_waits_for_a_load_not_for_a_busy_writer(tmp_path):
    """A request waiting for its SSD load is in steps with nothing scheduled; such a step
    must return once the load's reads are done, not wait out its timeout on a write."""
    store = GatedWrites(tmp_path, IDENTITY, budget_bytes=1 << 30)
    key = make_key("ld")
    store.gate.set()
    store.write_chunk(key, make_payload(KEY_BYTES, "ld"), provenance="p")
    store.gate.clear()
    w, caches, (store_s, load_s), _ = make_worker(store)
    fill_block(caches, 1, make_payload(KEY_BYTES, "bk"))
    w.submit_store(1, gpu_spec([1]), HiStateStoreSpec(slots=[0]))
    store_s.run()
    w.submit_ssd_writes([SSDWrite(key=make_key("bk"), slot=0, is_state=False, position=256)])
    assert finished(w) == [(1, True)]  # the store's copy; its SSD write now waits at the gate
    w.submit_load(2, HiStateLoadSpec(slots=[-1], keys=[key], is_state=[False]), gpu_spec([5]))
    t0 = time.perf_counter()
    w.wait_idle(5.0)
    assert time.perf_counter() - t0 < 2.5  # the read's time, not the 5 s timeout
    load_s.run()
    assert finished(w) == [(2, True)]
    np.testing.assert_array_equal(key_bytes_of(caches, 5), make_payload(KEY_BYTES, "ld"))
    t0 = time.perf_counter()
    w.wait_idle(0.2)  # no load left: an idle step waits for the writer, up to its timeout
    assert time.perf_counter() - t0 >= 0.15
    store.gate.set()
    w.shutdown()


def test_a_promoted_read_fills_its_dram_slot_with_the_verified_bytes(tmp_path):
    store = SlowStore(tmp_path, IDENTITY, budget_bytes=1 << 30, delay=0.0)
    keys = [make_key(f"p{i}") for i in range(3)]
    for i, k in enumerate(keys):
        store.write_chunk(k, make_payload(KEY_BYTES, f"p{i}"), provenance="p")
    w, caches, (_, load_s), _ = make_worker(store, read_ahead=1)
    # keys[0] and keys[2] are promoted into slots 5 and 1; keys[1] is only restored.
    spec = HiStateLoadSpec(slots=[-1] * 3, keys=keys, is_state=[False] * 3, fill=[5, -1, 1])
    w.submit_load(1, spec, gpu_spec([7, 8, 9]))
    wait_for(lambda: w._loads[1].future.done())
    load_s.run()
    assert finished(w) == [(1, True)]
    for i, b in enumerate((7, 8, 9)):
        np.testing.assert_array_equal(key_bytes_of(caches, b), make_payload(KEY_BYTES, f"p{i}"))
    np.testing.assert_array_equal(w.dram[5].numpy().view(np.uint8), make_payload(KEY_BYTES, "p0"))
    np.testing.assert_array_equal(w.dram[1].numpy().view(np.uint8), make_payload(KEY_BYTES, "p2"))
    assert not any(w.dram[s].any() for s in (0, 2, 3, 4, 6, 7))
    w.shutdown()


def test_a_corrupt_read_fills_no_promotion_slot(tmp_path):
    store = SlowStore(tmp_path, IDENTITY, budget_bytes=1 << 30, delay=0.0)
    k = make_key("bad")
    store.write_chunk(k, make_payload(KEY_BYTES, "bad"), provenance="p")
    path = Path(store.layout.chunk_path(k))
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # a flipped payload byte: the checksum fails
    path.write_bytes(bytes(raw))
    w, caches, (_, load_s), _ = make_worker(store, read_ahead=1)
    w.submit_load(1, HiStateLoadSpec(slots=[-1], keys=[k], is_state=[False], fill=[2]),
                  gpu_spec([3]))
    wait_for(lambda: w._loads[1].future.done())
    load_s.run()
    assert finished(w) == [(1, False)]
    assert not w.dram[2].any() and not key_bytes_of(caches, 3).any()
    w.shutdown()


def test_a_cancelled_restore_never_writes_a_promotion_slot(tmp_path):
    store = SlowStore(tmp_path, IDENTITY, budget_bytes=1 << 30, delay=0.0)
    k = make_key("late")
    store.write_chunk(k, make_payload(KEY_BYTES, "late"), provenance="p")
    gate = threading.Event()
    orig = store.read_chunk

    def blocked(key, out):
        gate.wait(30)
        return orig(key, out)

    store.read_chunk = blocked
    w, caches, (_, load_s), _ = make_worker(store, read_ahead=1)
    spec = HiStateLoadSpec(slots=[-1], keys=[k], is_state=[False], fill=[3])
    w.submit_load(1, spec, gpu_spec([2]))
    w._loads[1].cancel()  # what a timeout does; the scheduler then frees slot 3
    gate.set()
    wait_for(lambda: w._loads[1].future.done())
    load_s.run()
    assert finished(w) == [(1, False)]
    assert not w.dram[3].any() and not key_bytes_of(caches, 2).any()
    w.shutdown()
