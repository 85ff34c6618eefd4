"""The worker side of the SSD tier without an engine: deletes and resets ordered by the
scheduler, applied to this rank's store in order; a hung SSD read times out and fails
its job (recomputation) without ever copying into blocks it no longer owns."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))
from store_helpers import IDENTITY, make_key, make_payload  # noqa: E402

from histate_vllm.store import SSDStore  # noqa: E402
from histate_vllm.store.reset import RESET_MARK  # noqa: E402
from histate_vllm.vllm_glue.transfer_specs import (  # noqa: E402
    HiStateLoadSpec,
    SSDDelete,
    SSDReset,
    SSDWrite,
)
from histate_vllm.vllm_glue.worker import HiStateWorker  # noqa: E402

KEY_BYTES = 4096
NUM_BLOCKS = 8


def make_worker(store, timeout=60.0):
    from vllm.v1.kv_offload.base import GPULoadStoreSpec  # noqa: F401  (vllm importable)

    pages = torch.zeros((NUM_BLOCKS, KEY_BYTES), dtype=torch.int8)
    caches = SimpleNamespace(
        tensors=[SimpleNamespace(tensor=pages, page_size_bytes=KEY_BYTES)],
        group_data_refs=[[SimpleNamespace(tensor_idx=0, page_size_bytes=KEY_BYTES)]],
    )
    w = HiStateWorker(caches, key_bytes=KEY_BYTES, num_slots=4, store=store,
                      ssd_queue_bytes=1 << 20, ssd_read_timeout_s=timeout)
    return w, pages


def gpu_spec(block_ids):
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    return GPULoadStoreSpec(block_ids, group_sizes=[len(block_ids)], block_indices=[0])


def test_deletes_and_writes_apply_in_order_on_this_rank(tmp_path):
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    k = make_key("k")
    store.write_chunk(k, make_payload(KEY_BYTES, "old"), provenance="p")
    w, _ = make_worker(store)
    w.dram[0] = torch.from_numpy(make_payload(KEY_BYTES, "new").view(np.int8))
    # Evicted, then admitted again with new bytes: the delete must run first.
    w.submit_ssd_writes([SSDDelete(k, False),
                         SSDWrite(key=k, slot=0, is_state=False, position=256, chunk_keys=(),
                                  provenance="p")])
    assert w.writer.flush(timeout=10)
    out = np.empty(KEY_BYTES, np.uint8)
    store.read_chunk(k, out)
    np.testing.assert_array_equal(out, make_payload(KEY_BYTES, "new"))
    w.submit_ssd_writes([SSDDelete(k, False)])
    assert w.writer.flush(timeout=10)
    assert not store.has_chunk(k)
    w.get_finished()
    assert w.ssd_written == {k: True}  # the delete reports nothing
    w.shutdown()


def test_reset_moves_writes_to_a_new_directory_and_wipes_the_old(tmp_path):
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    old = make_key("old")
    store.write_chunk(old, make_payload(100, "x"), provenance="p")
    w, _ = make_worker(store)
    new = make_key("new")
    w.submit_ssd_writes([SSDReset("g1"),
                         SSDWrite(key=new, slot=0, is_state=False, position=256,
                                  chunk_keys=(), provenance="p")])
    assert w.writer.flush(timeout=10)
    assert w.store is w.writer.store and w.store.identity.extra.endswith(f"{RESET_MARK}g1")
    assert w.store.has_chunk(new) and not w.store.has_chunk(old)
    deadline = time.time() + 10
    while store.has_chunk(old) and time.time() < deadline:  # wiped in the background
        time.sleep(0.01)
    assert not store.has_chunk(old)
    assert Path(store.layout.identity_path).exists()  # the start-up directory stays
    w.shutdown()


class HungStore(SSDStore):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.returned = threading.Event()

    def read_chunk(self, key, out):
        self.entered.set()
        self.release.wait(30)
        try:
            return super().read_chunk(key, out)
        finally:
            self.returned.set()


def test_hung_read_times_out_and_never_writes_the_blocks_afterwards(tmp_path):
    store = HungStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    k = make_key("k")
    store.write_chunk(k, make_payload(KEY_BYTES, "k"), provenance="p")
    # Timeout and waits leave room for a busy shared machine's scheduling delays.
    w, pages = make_worker(store, timeout=1.0)
    w.submit_load(1, HiStateLoadSpec(slots=[-1], keys=[k], is_state=[False]), gpu_spec([3]))
    assert store.entered.wait(5)
    assert w.get_finished() == []  # not yet timed out
    time.sleep(1.1)
    [result] = w.get_finished()
    assert result.job_id == 1 and not result.success
    # The block now belongs to another request; the read finally returns.
    pages[3] = 7
    store.release.set()
    assert store.returned.wait(10)  # the late read is done, and must have written nothing
    time.sleep(0.05)
    assert bool((pages[3] == 7).all())
    # Later reads run on a fresh thread and buffer.
    w.submit_load(2, HiStateLoadSpec(slots=[-1], keys=[k], is_state=[False]), gpu_spec([4]))
    deadline = time.time() + 10
    done = []
    while not done and time.time() < deadline:
        done = w.get_finished()
        time.sleep(0.01)
    assert [(r.job_id, r.success) for r in done] == [(2, True)]
    np.testing.assert_array_equal(pages[4].numpy().view(np.uint8), make_payload(KEY_BYTES, "k"))
    w.shutdown()


def test_flush_wait_cancels_a_hung_read_before_returning(tmp_path):
    store = HungStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    k = make_key("k")
    store.write_chunk(k, make_payload(KEY_BYTES, "k"), provenance="p")
    w, pages = make_worker(store, timeout=0.2)
    w.submit_load(1, HiStateLoadSpec(slots=[-1], keys=[k], is_state=[False]), gpu_spec([3]))
    w.wait({1})  # vLLM then reuses the blocks
    assert not store.returned.is_set()  # returned with the read still hung
    pages[3] = 7
    store.release.set()
    assert store.returned.wait(10)  # the late read is done, and must have written nothing
    time.sleep(0.05)
    assert bool((pages[3] == 7).all())
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(1, False)]
    w.shutdown()


def test_staging_rings_are_made_at_start_up_and_off_the_engine_thread_and_closed(
        tmp_path, monkeypatch):
    """The SSD staging ring is allocated (and, on a GPU, pinned) when the worker starts,
    not at the first load; after a read timeout the fresh ring is made on the new reader
    thread, and the old one is closed (unregistered) only once its hung read has returned;
    shutdown closes the rest."""
    from histate_vllm.vllm_glue import worker as worker_mod

    made, closed = [], []

    class Rows(worker_mod.HostRows):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append((self, threading.current_thread().name))

        def close(self):
            closed.append(self)
            super().close()

    monkeypatch.setattr(worker_mod, "HostRows", Rows)
    store = HungStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    k = make_key("k")
    store.write_chunk(k, make_payload(KEY_BYTES, "k"), provenance="p")
    w, pages = make_worker(store, timeout=0.5)
    main = threading.current_thread().name
    assert [t for _, t in made] == [main, main]  # the DRAM pool, then the staging ring
    first = made[1][0]
    assert w._staging.result() is first and len(first.array) == 2 * w.read_ahead
    w.submit_load(1, HiStateLoadSpec(slots=[-1], keys=[k], is_state=[False]), gpu_spec([3]))
    assert store.entered.wait(5)
    time.sleep(0.6)
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(1, False)]
    second = w._staging.result(timeout=5)
    assert second is not first and made[-1] == (second, made[-1][1])
    assert made[-1][1].startswith("histate-ssd-load")  # not the engine thread
    w.get_finished()
    assert first not in closed  # the hung read may still write it
    store.release.set()
    assert store.returned.wait(10)
    deadline = time.time() + 10
    while first not in closed and time.time() < deadline:
        w.get_finished()
        time.sleep(0.01)
    assert first in closed and second not in closed
    w.shutdown()
    assert second in closed


@pytest.mark.parametrize("value", [0, -1, "soon", "0", True, float("inf")])
def test_read_timeout_must_be_positive_seconds(value):
    from histate_vllm.config import ConfigError, HiStateConfig

    with pytest.raises(ConfigError, match="'ssd_read_timeout_s' must be a positive"):
        HiStateConfig.from_extra_config({"dram_bytes": 1, "ssd_read_timeout_s": value})
    assert HiStateConfig.from_extra_config(
        {"dram_bytes": 1, "ssd_read_timeout_s": 2.5}).ssd_read_timeout_s == 2.5
