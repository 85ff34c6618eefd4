"""HiStateWorker: moves bytes between vLLM's paged KV cache, a DRAM slot pool and the SSD store.

Runs in the worker process. One offload key is one block of one KV cache group: its page in
every layer of the group, laid end to end in one DRAM slot (and in one SSD file).

- Stores (GPU -> DRAM) copy at submit time: the pages may be reused right after the step.
- SSD writes read the DRAM slot from the store's background writer thread; the scheduler
  keeps the slot pinned until the write is reported.
- Loads that touch SSD run on a reader thread, one key at a time through a staging buffer,
  each verified before it is copied; a corrupt or missing file fails the job, and vLLM
  recomputes the request instead of running it on a partial restore.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from histate_vllm.specs import HiStateLoadSpec, HiStateStoreSpec, SSDWrite
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
        self._finished: list[TransferResult] = []
        # One key's bytes: the only host memory beyond the DRAM pool (SSD restores).
        self._staging: np.ndarray | None = None
        self._loads: dict[int, Future] = {}
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
            self._loads[job_id] = self._reader.submit(self._load_with_ssd, src_spec, dst_spec)
        return True

    def _load_from_dram(self, src: HiStateLoadSpec, dst: GPULoadStoreSpec) -> None:
        slots = np.asarray(src.slots, dtype=np.int64)
        for views, block_ids, keys in self._blocks_by_group(dst):
            self._copy_to_blocks(views, block_ids, self.dram[torch.from_numpy(slots[keys])])

    def _load_with_ssd(self, src: HiStateLoadSpec, dst: GPULoadStoreSpec) -> tuple[float, int]:
        """Restore a job key by key through one staging buffer, each verified before copying.

        Nothing restored here can run before the whole job reports success: on failure
        vLLM recomputes the request and zeroes the blocks it had allocated for the load."""
        t0 = time.perf_counter()
        if self._staging is None:
            self._staging = aligned_buffer(self.key_bytes).view(np.int8).reshape(1, -1)
        staged = torch.from_numpy(self._staging)
        for views, block_ids, keys in self._blocks_by_group(dst):
            for block_id, i in zip(block_ids, range(keys.start, keys.stop)):
                key, slot = src.keys[i], src.slots[i]
                if slot >= 0:
                    self._staging[0] = self._dram_np[slot]
                elif src.is_state[i]:
                    # The KV before it is restored by this same job, each chunk verified by
                    # its own read, from whichever tier holds it.
                    self.store.read_checkpoint(key, self._staging[0], verify_chunks=False)
                else:
                    self.store.read_chunk(key, self._staging[0])
                self._copy_to_blocks(views, [block_id], staged)
        # With the bytes moved: vLLM drops a load's transfer stats when their size is unknown.
        return time.perf_counter() - t0, len(src.keys) * self.key_bytes

    # --- DRAM -> SSD ---

    def submit_ssd_writes(self, writes: list[SSDWrite]) -> None:
        for w in writes:
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

    # --- completion ---

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        for job_id, fut in list(self._loads.items()):
            if not fut.done():
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
            fut = self._loads.get(job_id)
            if fut is not None:
                fut.exception()  # blocks until done; errors surface in get_finished

    def shutdown(self) -> None:
        self._reader.shutdown(wait=True)
        if self.writer is not None:
            # Drain what is queued so a clean restart finds it published.
            self.writer.close(drain=True, timeout=60)
