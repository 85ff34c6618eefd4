"""HiStateWorker: moves bytes between vLLM's paged KV cache, a DRAM slot pool and the SSD store.

Runs in the worker process. One offload key is one block of one KV cache group: its page in
every layer of the group, laid end to end in one DRAM slot (and in one SSD file).

- Stores (GPU -> DRAM) copy at submit time: the pages may be reused right after the step.
- SSD writes read the DRAM slot from the store's background writer thread; the scheduler
  keeps the slot pinned until the write is reported.
- Loads that touch SSD run on a reader thread, one key at a time through a staging buffer,
  each verified before it is copied; a corrupt or missing file fails the job, and vLLM
  recomputes the request instead of running it on a partial restore. A read that hangs
  past `ssd_read_timeout_s` fails its job the same way: the job is cancelled (it copies
  nothing more), and later reads go to a fresh thread and buffer.
- Deletes and resets from the scheduler run on the store's writer thread, in order with
  the writes: every rank applies them to its own shard.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from histate_vllm.specs import HiStateLoadSpec, HiStateStoreSpec, SSDDelete, SSDReset, SSDWrite
from histate_vllm.store import reset as store_reset
from histate_vllm.store import (
    CorruptEntry,
    MissingEntry,
    SSDStore,
    StoreError,
    StoreWriter,
    aligned_buffer,
)

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply


class HiStateWorker(OffloadingWorker):
    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        key_bytes: int,
        num_slots: int,
        store: SSDStore | None,
        ssd_queue_bytes: int,
        ssd_read_timeout_s: float = 60.0,
    ):
        # Per offloaded group: (page tensor [num_blocks, page_bytes] int8, bytes, offset in key).
        self._groups: list[list[tuple[torch.Tensor, int, int]]] = []
        for refs in kv_caches.group_data_refs:
            views, offset = [], 0
            for ref in refs:
                tensor = kv_caches.tensors[ref.tensor_idx].tensor
                views.append((tensor, ref.page_size_bytes, offset))
                offset += ref.page_size_bytes
            assert offset <= key_bytes, f"group needs {offset} bytes per key, slot has {key_bytes}"
            self._groups.append(views)
        device = kv_caches.tensors[0].tensor.device if kv_caches.tensors else torch.device("cpu")
        # Pages of the pool cost nothing until first written. Page-aligned rows (on CPU)
        # let the store write them with O_DIRECT, without a staging copy.
        if device.type == "cuda":
            self.dram = torch.empty((num_slots, key_bytes), dtype=torch.int8, pin_memory=True)
        else:
            pool = aligned_buffer(num_slots * key_bytes).view(np.int8)
            self.dram = torch.from_numpy(pool.reshape(num_slots, key_bytes))
        self._dram_np = self.dram.numpy()
        self.key_bytes = key_bytes
        self.store = store
        self.writer = (
            StoreWriter(store, max_pending_bytes=ssd_queue_bytes) if store is not None else None
        )
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="histate-ssd-read")
        self.read_timeout_s = ssd_read_timeout_s
        self._finished: list[TransferResult] = []
        # One key's bytes: the only host memory beyond the DRAM pool (SSD restores). A
        # new one with each new reader thread: a hung read may still write the old one.
        self._staging: np.ndarray | None = None
        # job id -> (future, cancel flag + lock, submit time)
        self._loads: dict[int, tuple[Future, _Cancel, float]] = {}
        # SSD outcomes for the scheduler: key -> written?, and keys found unusable.
        self.ssd_written: dict[bytes, bool] = {}
        self.ssd_lost: set[bytes] = set()

    # --- GPU <-> DRAM ---

    def _blocks_by_group(self, spec: GPULoadStoreSpec):
        """Yield (group views, block ids, index range into the job's key list)."""
        start = 0
        for views, size in zip(self._groups, spec.group_sizes):
            if size:
                yield views, spec.block_ids[start : start + size], slice(start, start + size)
            start += size

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec) -> bool:
        assert isinstance(dst_spec, HiStateStoreSpec)
        t0 = time.perf_counter()
        slots = np.asarray(dst_spec.slots, dtype=np.int64)
        for views, block_ids, keys in self._blocks_by_group(src_spec):
            blocks = torch.from_numpy(np.asarray(block_ids, dtype=np.int64))
            slot_idx = torch.from_numpy(slots[keys])
            for tensor, nbytes, offset in views:
                pages = tensor.index_select(0, blocks.to(tensor.device))[:, :nbytes]
                self.dram[slot_idx, offset : offset + nbytes] = pages.to("cpu")
        self._finished.append(
            TransferResult(job_id, True, len(slots) * self.key_bytes, time.perf_counter() - t0)
        )
        return True

    def _copy_to_blocks(self, views, block_ids, rows: torch.Tensor) -> None:
        blocks = torch.from_numpy(np.asarray(block_ids, dtype=np.int64))
        for tensor, nbytes, offset in views:
            tensor[blocks.to(tensor.device), :nbytes] = rows[:, offset : offset + nbytes].to(
                tensor.device
            )

    def submit_load(self, job_id: int, src_spec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, HiStateLoadSpec)
        if all(slot >= 0 for slot in src_spec.slots):
            t0 = time.perf_counter()
            self._load_from_dram(src_spec, dst_spec)
            self._finished.append(TransferResult(
                job_id, True, len(src_spec.slots) * self.key_bytes, time.perf_counter() - t0
            ))
        else:
            if self._staging is None:
                self._staging = aligned_buffer(self.key_bytes).view(np.int8).reshape(1, -1)
            cancel = _Cancel()
            fut = self._reader.submit(self._load_with_ssd, src_spec, dst_spec, self._staging,
                                      cancel)
            self._loads[job_id] = (fut, cancel, time.monotonic())
        return True

    def _load_from_dram(self, src: HiStateLoadSpec, dst: GPULoadStoreSpec) -> None:
        slots = np.asarray(src.slots, dtype=np.int64)
        for views, block_ids, keys in self._blocks_by_group(dst):
            self._copy_to_blocks(views, block_ids, self.dram[torch.from_numpy(slots[keys])])

    def _load_with_ssd(self, src: HiStateLoadSpec, dst: GPULoadStoreSpec,
                       staging: np.ndarray, cancel: _Cancel) -> tuple[float, int]:
        """Restore a job key by key through one staging buffer, each verified before copying.

        Nothing restored here can run before the whole job reports success: on failure
        vLLM recomputes the request and zeroes the blocks it had allocated for the load.
        Once the job is cancelled (timed out) its blocks may belong to another request, so
        every copy into them happens under the cancel lock, after checking the flag."""
        t0 = time.perf_counter()
        staged = torch.from_numpy(staging)
        for views, block_ids, keys in self._blocks_by_group(dst):
            for block_id, i in zip(block_ids, range(keys.start, keys.stop)):
                key, slot = src.keys[i], src.slots[i]
                if slot >= 0:
                    staging[0] = self._dram_np[slot]
                elif src.is_state[i]:
                    # The KV before it is restored by this same job, each chunk verified by
                    # its own read, from whichever tier holds it.
                    self.store.read_checkpoint(key, staging[0], verify_chunks=False)
                else:
                    self.store.read_chunk(key, staging[0])
                with cancel.lock:
                    if cancel.cancelled:
                        raise StoreError("restore cancelled after its timeout")
                    self._copy_to_blocks(views, [block_id], staged)
        # With the bytes moved: vLLM drops a load's transfer stats when their size is unknown.
        return time.perf_counter() - t0, len(src.keys) * self.key_bytes

    def _time_out(self, job_id: int, cancel: _Cancel) -> TransferResult:
        """Fail a load stuck in a read: cancel it, and leave its thread and buffer behind."""
        with cancel.lock:  # waits for a copy in progress; none starts after this
            cancel.cancelled = True
        logger.warning("HiState: SSD read of job %d took over %.0f s; recomputing instead",
                       job_id, self.read_timeout_s)
        self._reader.shutdown(wait=False)
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="histate-ssd-read")
        self._staging = None
        return TransferResult(job_id, False)

    # --- DRAM -> SSD ---

    def submit_ssd_writes(self, writes: list[SSDWrite | SSDDelete | SSDReset]) -> None:
        for w in writes:
            if isinstance(w, SSDDelete):
                self.writer.submit_task(_deleter(w), what="delete")
                continue
            if isinstance(w, SSDReset):
                self.writer.submit_task(self._resetter(w.generation), what="reset")
                continue
            payload = self._dram_np[w.slot]
            if w.is_state:
                ok = self.writer.submit_checkpoint(
                    w.key, payload, position=w.position, chunk_keys=w.chunk_keys,
                    provenance=w.provenance,
                )
            else:
                ok = self.writer.submit_chunk(w.key, payload, provenance=w.provenance)
            if not ok:  # the writer reports the rejection through drain_finished()
                logger.debug("HiState: SSD queue full, %s stays in DRAM", w.key.hex()[:16])

    def poll_ssd(self) -> None:
        if self.writer is None:
            return
        for c in self.writer.drain_finished():
            if c.reason == "superseded":
                continue
            self.ssd_written[c.key] = c.ok

    def _resetter(self, generation: str):
        def reset(old: SSDStore) -> None:  # on the writer thread, after earlier writes
            new = SSDStore(old.root, store_reset.reset_identity(old.identity, generation),
                           budget_bytes=old.budget_bytes)
            self.writer.store = self.store = new
            threading.Thread(target=store_reset.wipe, args=(old,), daemon=True,
                             name="histate-store-wipe").start()
            logger.info("HiState: connector reset; SSD entries now go to %s", new.layout.dir)

        return reset

    # --- completion ---

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        now = time.monotonic()
        for job_id, (fut, cancel, t0) in list(self._loads.items()):
            if not fut.done():
                if now - t0 > self.read_timeout_s:
                    del self._loads[job_id]
                    done.append(self._time_out(job_id, cancel))
                continue
            del self._loads[job_id]
            try:
                elapsed, nbytes = fut.result()
                done.append(TransferResult(job_id, True, nbytes, elapsed))
            except (CorruptEntry, MissingEntry) as exc:
                logger.warning("HiState: restore failed, falling back to recompute: %s", exc)
                self.ssd_lost.add(exc.key)
                self.ssd_lost.update(getattr(exc, "quarantined", ()))
                done.append(TransferResult(job_id, False))
            except StoreError as exc:
                logger.warning("HiState: restore failed, falling back to recompute: %s", exc)
                done.append(TransferResult(job_id, False))
        self.poll_ssd()
        return done

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            load = self._loads.get(job_id)
            if load is not None:
                fut, cancel, t0 = load
                left = max(0.0, t0 + self.read_timeout_s - time.monotonic())
                try:
                    fut.exception(timeout=left)  # errors surface in get_finished
                except FutureTimeout:
                    # The caller reuses the blocks next: cancel before returning.
                    del self._loads[job_id]
                    self._finished.append(self._time_out(job_id, cancel))

    def shutdown(self) -> None:
        self._reader.shutdown(wait=not self._loads)  # never wait on a hung read
        if self.writer is not None:
            # Drain what is queued so a clean restart finds it published.
            self.writer.close(drain=True, timeout=60)


class _Cancel:
    __slots__ = ("cancelled", "lock")

    def __init__(self) -> None:
        self.cancelled = False
        self.lock = threading.Lock()


def _deleter(d: SSDDelete):
    def delete(store: SSDStore) -> None:
        if d.is_state:
            store.delete_checkpoint(d.key)
        else:
            store.delete_chunk(d.key)

    return delete
