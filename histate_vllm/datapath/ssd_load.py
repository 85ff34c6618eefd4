"""The SSD read pipeline of a load: keys in DRAM copied in one batch, keys on SSD read in
parallel into a staging ring, each verified, then copied to its block while the next
files are read. Runs on the worker's reader thread; vLLM-free (the worker drives it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future

from histate_vllm.datapath.copier import PageCopier
from histate_vllm.datapath.hostmem import HostRows
from histate_vllm.datapath.streams import Event, TransferStream
from histate_vllm.store import Read, SSDStore, StoreError


class SSDLoad:
    """One load that reads SSD: its reader future, and the copies it has queued.

    `queue` and `cancel` share a lock, so once `cancel` returns no copy is queued for the
    job, and the last one queued has finished."""

    __slots__ = ("cancelled", "future", "last", "lock", "t0")

    def __init__(self) -> None:
        self.cancelled = False
        self.future: Future | None = None
        self.last: Event | None = None  # the end event of the last copy queued
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()

    def queue(self, launch) -> Event:
        with self.lock:
            if self.cancelled:
                raise StoreError("restore cancelled after its timeout")
            self.last = launch()
            return self.last

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            if self.last is not None:
                self.last.synchronize()


def restore(copier: PageCopier, stream: TransferStream, store: SSDStore, dram: HostRows,
            staging: HostRows, io: Executor, read_ahead: int, keys: Sequence[bytes],
            is_state: Sequence[bool], slots: Sequence[int], parts, after: Event | None,
            job: SSDLoad, fill: Sequence[int] = ()) -> int:
    """Restore a job: DRAM keys in one batch, SSD keys read in parallel, each verified
    before its copy is queued. Returns the bytes moved.

    `slots[i]` is key i's DRAM slot or -1 (on SSD); `parts` is (group, block ids, key
    indices) per group. Nothing restored here can run before the whole job reports success:
    on failure vLLM recomputes the request and zeroes the blocks it had allocated for the
    load. Once the job is cancelled (timed out) its blocks may belong to another request, so
    every copy into them is queued under the job's lock, after checking the flag.
    `fill[i]` >= 0: key i, read from SSD, is promoted: its verified bytes also go into that
    DRAM slot, under the same lock (a slot given back after a timeout is never written)."""
    in_dram, on_ssd = [], []  # (group, block id, slot or index in the job)
    for g, blocks, idx in parts:
        for block, i in zip(blocks, idx):
            slot = slots[i]
            (in_dram if slot >= 0 else on_ssd).append((g, block, slot if slot >= 0 else i))
    nbytes = 0
    if in_dram:
        by_group: dict[int, tuple[list[int], list[int]]] = {}
        for g, block, slot in in_dram:
            blocks, group_slots = by_group.setdefault(g, ([], []))
            blocks.append(block)
            group_slots.append(slot)
        batch = copier.batch([(g, b, s) for g, (b, s) in by_group.items()], dram.tensor,
                             to_host=False, breaks=dram.breaks)
        job.queue(lambda: stream.launch(batch, after=after))
        nbytes += batch.nbytes
    ring = len(staging.array)
    reads = [Read(keys[i], is_state[i], staging.array[j % ring])
             for j, (_, _, i) in enumerate(on_ssd)]
    # The copy out of each staging row; the previous job's last ones may still run.
    filled = staging.filled
    for event in filled:
        if event is not None:
            event.synchronize()
    for j, _ in store.read_many(reads, ahead=read_ahead, executor=io):
        g, block, i = on_ssd[j]
        row = j % ring
        batch = copier.batch([(g, [block], [row])], staging.tensor, to_host=False)
        slot = fill[i] if fill else -1

        def launch(batch=batch, row=row, slot=slot):
            if slot >= 0:
                dram.array[slot] = staging.array[row]
            return stream.launch(batch, after=after)

        filled[row] = job.queue(launch)
        nbytes += batch.nbytes
        # Read j + read_ahead starts next, into the row of copy j + read_ahead - ring.
        previous = filled[(j + read_ahead) % ring]
        if previous is not None:
            previous.synchronize()
    return nbytes
