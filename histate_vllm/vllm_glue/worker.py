"""HiStateWorker: moves bytes between vLLM's paged KV cache, a DRAM slot pool and the SSD store.

Runs in the worker process. One offload key is one block of one KV cache group: its page in
every layer of the group, laid end to end in one DRAM slot (and in one SSD file). The bytes
move through the vLLM-free modules of `histate_vllm.datapath` (page views, copier, streams,
pinned host rows, the SSD read pipeline); this class adapts them to vLLM's worker contract.
Start-up checks the page layout (`datapath.pages`), pins the DRAM pool and the SSD staging
ring (or fails: `datapath.hostmem.PinError`).

Nothing here blocks the model step, and nothing is reported done before its bytes are in
place (see `streams`):
- Stores (GPU -> DRAM) and loads from DRAM are one batched copy per job (`copier`) between
  vLLM's pages and the pinned slot pool, on a transfer stream ordered after the compute
  stream's work so far. `get_finished` reports a job once its end event has fired; `wait`
  blocks on that event (vLLM calls it before reusing a job's blocks).
- SSD writes read a DRAM slot on the store's writer threads. One whose slot is still being
  filled by a store job is held back (with everything after it, so the order of writes,
  deletes and resets is kept) until that job's event fires; the scheduler keeps the slot
  pinned until the write is reported.
- Loads that touch SSD run on a reader thread: keys already in DRAM are copied in one
  batch, the others read `read_ahead` files in parallel into a pinned staging ring
  (`SSDStore.read_many`), each verified, then copied to its block while the next files
  are read. A corrupt or missing file fails the job, and vLLM recomputes the request
  instead of running it on a partial restore. A failed job is reported only after the
  copies it had queued have finished (vLLM zeroes and reuses those blocks next).
- A read that hangs past `ssd_read_timeout_s` fails its job the same way: the job is
  cancelled (it queues nothing more, and its queued copies are waited for), and later
  reads go to fresh threads and a fresh staging ring, pinned on the new reader thread; the
  old ring is unregistered once no read can still write it.
- Deletes and resets from the scheduler run on the store's writer thread, in order with
  the writes: every rank applies them to its own shard.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from concurrent.futures import TimeoutError as FutureTimeout

import torch
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    OffloadingWorker,
    TransferResult,
)

from histate_vllm.datapath.copier import PageCopier, host_swap_blocks_batch
from histate_vllm.datapath.hostmem import HostRows
from histate_vllm.datapath.pages import blocks_from_pointers, group_views
from histate_vllm.datapath.ssd_load import SSDLoad, restore
from histate_vllm.datapath.streams import Event, TransferStream, transfer_stream
from histate_vllm.store import (
    CorruptEntry,
    MissingEntry,
    SSDStore,
    StoreError,
    StoreWriter,
)
from histate_vllm.store import reset as store_reset
from histate_vllm.store.threads import executor, start_thread
from histate_vllm.vllm_glue.seam.worker import job_blocks, swap_blocks_batch
from histate_vllm.vllm_glue.transfer_specs import (
    HiStateLoadSpec,
    HiStateStoreSpec,
    SSDDelete,
    SSDReset,
    SSDWrite,
)

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply


def _swap_op(device: torch.device):
    """vLLM's batched page copy (`swap_blocks_batch`) on a GPU where vLLM built it; its
    memmove twin on a CPU (one call per page, in the step, as vLLM's would be)."""
    if device.type == "cpu":
        return host_swap_blocks_batch
    return swap_blocks_batch(device)


class HiStateWorker(OffloadingWorker):
    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        key_bytes: int,
        num_slots: int,
        store: SSDStore | None,
        ssd_queue_bytes: int,
        ssd_read_timeout_s: float = 60.0,
        *,
        read_ahead: int = 4,
        streams: tuple[TransferStream, TransferStream] | None = None,
        copier: PageCopier | None = None,
    ):
        """streams: (store stream, load stream); by default device streams on a GPU and
        synchronous ones on a CPU. Tests pass fakes for both streams and copier."""
        # Per offloaded group: (page tensor [num_blocks, page_bytes] int8, bytes, offset in
        # key), each checked: a layout the copies cannot move stops start-up here.
        self._groups = group_views([t.tensor for t in kv_caches.tensors],
                                   kv_caches.group_data_refs, key_bytes)
        device = kv_caches.tensors[0].tensor.device if kv_caches.tensors else torch.device("cpu")
        self._pin = device.type == "cuda"
        # Pinned now, at start-up, or PinError: never pageable rows a copy would stall on.
        self._pool = HostRows(num_slots, key_bytes, pin=self._pin)
        self.dram = self._pool.tensor
        self._dram_np = self._pool.array
        self.key_bytes = key_bytes
        self.copier = copier or PageCopier(self._groups, swap_fn=_swap_op(device))
        self._store_stream, self._load_stream = streams or (
            transfer_stream(device), transfer_stream(device)
        )
        self.store = store
        self.writer = (
            StoreWriter(store, max_pending_bytes=ssd_queue_bytes) if store is not None else None
        )
        self.read_ahead = read_ahead
        self.read_timeout_s = ssd_read_timeout_s
        self._reader, self._io = self._new_readers()
        # Staging rows for SSD reads: twice the reads in flight, so a row's copy to the
        # GPU can run while the next reads fill the others; allocated and pinned here, at
        # start-up, not on the engine thread at the first load. A new ring with each new
        # reader, pinned on that reader's thread: a hung read may still write the old one,
        # which is unregistered once every load that used it is over.
        self._staging: Future | None = None
        self._ring_loads: list[Future] = []  # loads that use the current ring
        self._retired: list[tuple[Future, list[Future]]] = []
        if store is not None:
            self._staging = Future()
            self._staging.set_result(self._new_ring())
        # Copies queued on a stream: job id -> (end event, bytes).
        self._copies: dict[int, tuple[Event, int]] = {}
        # The last store into each slot, until an SSD write of it has checked it fired.
        self._slot_filled: dict[int, Event] = {}
        self._ssd_queue: deque[SSDWrite | SSDDelete | SSDReset] = deque()
        self._loads: dict[int, SSDLoad] = {}
        self._finished: list[TransferResult] = []  # failed by `wait` (timed out)
        # Set by a vLLM worker that takes every job as a success (0.32, 0.33; see
        # seam.worker): a failed job is then handed over as done and named in
        # `take_failed_jobs`.
        self.failures_as_done = False
        self._failed_jobs: list[int] = []
        # SSD outcomes for the scheduler: key -> written?, and keys found unusable.
        self.ssd_written: dict[bytes, bool] = {}
        self.ssd_lost: set[bytes] = set()

    def _new_readers(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        return (executor(1, "histate-ssd-load", writes=False),
                executor(self.read_ahead, "histate-ssd-read", writes=False))

    def _new_ring(self) -> HostRows:
        return HostRows(2 * self.read_ahead, self.key_bytes, pin=self._pin)

    def _close_retired_rings(self) -> None:
        """Unregister old staging rings no read can still write (their loads are over)."""
        keep = []
        for ring, loads in self._retired:
            if ring.done() and all(f.done() for f in loads):
                if ring.exception() is None:
                    ring.result().close()
            else:
                keep.append((ring, loads))
        self._retired = keep

    # --- GPU <-> DRAM ---

    def _parts(self, spec, slots):
        """(group index, block ids, slots) per group of a job, from the job's key order.
        `spec`: the job's GPU side, as this vLLM hands it (see `seam.worker.job_blocks`)."""
        group_sizes, block_ids = job_blocks(
            spec, lambda *pointers: blocks_from_pointers(self._groups, *pointers))
        parts, start = [], 0
        for g, size in enumerate(group_sizes):
            if size:
                parts.append((g, block_ids[start : start + size], slots[start : start + size]))
            start += size
        return parts

    def submit_store(self, job_id: int, src_spec, dst_spec) -> bool:
        assert isinstance(dst_spec, HiStateStoreSpec)
        batch = self.copier.batch(self._parts(src_spec, dst_spec.slots), self.dram,
                                  to_host=True, breaks=self._pool.breaks)
        stream = self._store_stream
        event = stream.launch(batch, after=stream.mark_compute())
        self._copies[job_id] = (event, batch.nbytes)
        for slot in dst_spec.slots:
            self._slot_filled[slot] = event
        return True

    def submit_load(self, job_id: int, src_spec, dst_spec, expedited: bool = False) -> bool:
        # `expedited` (vLLM 0.33+): a load vLLM waits for in the step (`wait`); never
        # issued here, since the connector keeps vLLM's sync-load budget at 0.
        assert isinstance(src_spec, HiStateLoadSpec)
        stream = self._load_stream
        after = stream.mark_compute()  # on the engine thread: the compute stream
        if all(slot >= 0 for slot in src_spec.slots):
            batch = self.copier.batch(self._parts(dst_spec, src_spec.slots), self.dram,
                                      to_host=False, breaks=self._pool.breaks)
            self._copies[job_id] = (stream.launch(batch, after=after), batch.nbytes)
            return True
        if self.store is None:
            raise ValueError("a load from SSD, but this worker has no SSD store")
        job = SSDLoad()
        job.future = self._reader.submit(self._load_with_ssd, src_spec, dst_spec, after,
                                         self._staging, self._io, job)
        self._ring_loads.append(job.future)
        self._loads[job_id] = job
        return True

    def _load_with_ssd(self, src: HiStateLoadSpec, dst, after: Event | None,
                       staging: Future, io: ThreadPoolExecutor, job: SSDLoad) -> int:
        """On the reader thread: the job's SSD read pipeline (datapath.ssd_load)."""
        parts = self._parts(dst, list(range(len(src.keys))))
        # Done: at start-up, or first in this reader's queue after a timeout.
        ring = staging.result()
        return restore(self.copier, self._load_stream, self.store, self._pool, ring, io,
                       self.read_ahead, src.keys, src.is_state, src.slots, parts, after, job,
                       src.fill)

    def _time_out(self, job_id: int, job: SSDLoad) -> TransferResult:
        """Fail a load stuck in a read: cancel it, and leave its threads and ring behind."""
        job.cancel()  # waits for a copy being queued; none is queued after this
        logger.warning("HiState: SSD read of job %d took over %.0f s; recomputing instead",
                       job_id, self.read_timeout_s)
        self._reader.shutdown(wait=False)
        self._io.shutdown(wait=False)
        self._reader, self._io = self._new_readers()
        self._retired.append((self._staging, self._ring_loads))
        self._staging = self._reader.submit(self._new_ring)
        self._ring_loads = []
        return TransferResult(job_id, False)

    # --- DRAM -> SSD ---

    def submit_ssd_writes(self, writes: list[SSDWrite | SSDDelete | SSDReset]) -> None:
        self._ssd_queue.extend(writes)
        self._pass_ssd_writes()

    def _pass_ssd_writes(self) -> None:
        """Hand queued SSD operations to the writer, in order, up to the first write whose
        slot a store job is still filling."""
        while self._ssd_queue:
            w = self._ssd_queue[0]
            if isinstance(w, SSDWrite):
                filled = self._slot_filled.get(w.slot)
                if filled is not None:
                    if not filled.query():
                        return
                    del self._slot_filled[w.slot]
            self._ssd_queue.popleft()
            self._submit_ssd(w)

    def _submit_ssd(self, w: SSDWrite | SSDDelete | SSDReset) -> None:
        if isinstance(w, SSDDelete):
            self.writer.submit_task(_deleter(w), what="delete")
            return
        if isinstance(w, SSDReset):
            self.writer.submit_task(self._resetter(w.generation), what="reset")
            return
        payload = self._dram_np[w.slot]
        if w.is_state:
            ok = self.writer.submit_checkpoint(
                w.key, payload, position=w.position, chunk_keys=w.chunk_keys,
                provenance=w.provenance, ahead=w.ahead,
            )
        else:
            ok = self.writer.submit_chunk(w.key, payload, provenance=w.provenance)
        if not ok:  # the writer reports the rejection through drain_finished()
            logger.debug("HiState: SSD queue full, %s stays in DRAM", w.key.hex()[:16])

    def wait_idle(self, timeout: float) -> None:
        """A step with nothing scheduled: vLLM steps an idle engine while SSD writes are in
        flight (`has_pending_work`); wait for one to finish rather than spin steps.

        A request waiting for a load is in such a step too, and its load is what it waits
        for: then wait for the load, not for the writer. (Waiting for the next write held a
        finished load's report back up to `timeout` a step: a one-block SSD restore took
        10-20 ms more than the read.)"""
        if self._copies:  # a DRAM load's or a store's copy: short, report it next step
            return
        if self._loads:
            reads = [job.future for job in self._loads.values()
                     if job.future is not None and not job.future.done()]
            if reads:
                futures_wait(reads, timeout=timeout, return_when=FIRST_COMPLETED)
            return
        if self.writer is None:
            return
        if self._ssd_queue:  # waiting on a store copy into its slot: it is short
            time.sleep(min(timeout, 0.001))
        else:
            self.writer.wait_finished(timeout)

    def ssd_settled(self) -> bool:
        """No SSD operation waits here or in the writer, and every outcome went to the
        scheduler (`ssd_written`, cleared when a step reports it)."""
        if self.writer is None:
            return True
        return not (self._ssd_queue or self.ssd_written or self.ssd_lost) and self.writer.idle()

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
                           budget_bytes=old.budget_bytes, fsync=old.fsync)
            self.writer.store = self.store = new
            start_thread(store_reset.wipe, args=(old,), name="histate-store-wipe", writes=True)
            logger.info("HiState: connector reset; SSD entries now go to %s", new.layout.dir)

        return reset

    # --- completion ---

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        for job_id, (event, nbytes) in list(self._copies.items()):
            if event.query():
                del self._copies[job_id]
                # The copy's own time, from events around it on the transfer stream.
                done.append(TransferResult(job_id, True, nbytes, event.seconds()))
        for job_id, job in list(self._loads.items()):
            result = self._ssd_result(job_id, job)
            if result is not None:
                del self._loads[job_id]
                done.append(result)
        if self._ring_loads and self._ring_loads[0].done():
            self._ring_loads = [f for f in self._ring_loads if not f.done()]
        if self._retired:
            self._close_retired_rings()
        self._pass_ssd_writes()
        self.poll_ssd()
        if self.failures_as_done:
            self._failed_jobs.extend(r.job_id for r in done if not r.success)
            done = [r if r.success else TransferResult(r.job_id, True) for r in done]
        return done

    def take_failed_jobs(self) -> list[int]:
        """Jobs that failed, handed to vLLM as done since the last call (vLLM 0.32, 0.33)."""
        failed, self._failed_jobs = self._failed_jobs, []
        return failed

    def _ssd_result(self, job_id: int, job: SSDLoad) -> TransferResult | None:
        """The job's outcome once its reads are over and its queued copies have finished."""
        if not job.future.done():
            if time.perf_counter() - job.t0 > self.read_timeout_s:
                return self._time_out(job_id, job)
            return None
        if job.last is not None and not job.last.query():
            return None  # copies still running, into blocks vLLM reuses on failure too
        exc = job.future.exception()
        if exc is None:
            return TransferResult(job_id, True, job.future.result(), time.perf_counter() - job.t0)
        if isinstance(exc, (CorruptEntry, MissingEntry)):
            self.ssd_lost.add(exc.key)
            self.ssd_lost.update(getattr(exc, "quarantined", ()))
        if not isinstance(exc, StoreError):
            logger.error("HiState: restore failed unexpectedly", exc_info=exc)
        logger.warning("HiState: restore failed, falling back to recompute: %s", exc)
        return TransferResult(job_id, False)

    def wait(self, job_ids: set[int]) -> None:
        for job_id in job_ids:
            copy = self._copies.get(job_id)
            if copy is not None:
                copy[0].synchronize()
            job = self._loads.get(job_id)
            if job is None:
                continue
            left = max(0.0, job.t0 + self.read_timeout_s - time.perf_counter())
            try:
                job.future.exception(timeout=left)  # errors surface in get_finished
            except FutureTimeout:
                # The caller reuses the blocks next: cancel before returning.
                del self._loads[job_id]
                self._finished.append(self._time_out(job_id, job))
                continue
            if job.last is not None:
                job.last.synchronize()

    def shutdown(self) -> None:
        for event, *_ in self._copies.values():
            event.synchronize()
        for job in self._loads.values():
            job.cancel()
        self._reader.shutdown(wait=False)  # never wait on a hung read
        self._io.shutdown(wait=False)
        if self.writer is not None:
            for event in self._slot_filled.values():
                event.synchronize()
            self._pass_ssd_writes()
            # Drain what is queued so a clean restart finds it published.
            self.writer.close(drain=True, timeout=60)
        if not self._loads:  # else a hung read's copies might still target it
            self._pool.close()
        if self._staging is not None:
            self._retired.append((self._staging, self._ring_loads))
            self._staging, self._ring_loads = None, []
        self._close_retired_rings()  # a ring a hung read may still write stays registered


def ssd_settled(_vllm_worker=None) -> bool:
    """In a worker process (vLLM's `collective_rpc`): whether this rank's SSD work is
    done (`HiStateWorker.ssd_settled`); True without a HiState connector."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return True
    side = getattr(get_kv_transfer_group(), "connector_worker", None)
    worker = getattr(side, "worker", None)
    return not isinstance(worker, HiStateWorker) or worker.ssd_settled()


def _deleter(d: SSDDelete):
    def delete(store: SSDStore) -> None:
        if d.is_state:
            store.delete_checkpoint(d.key)
        else:
            store.delete_chunk(d.key)

    return delete
