"""StoreWriter: the background write queue in front of an SSDStore.

The engine thread only enqueues; a daemon thread dispatches in order, chunk writes run
on `io_threads` threads at once and checkpoints on a publisher thread. `submit_*` takes a
lock, appends and returns (no I/O, no copy: the payload must already be a copy the caller
owns and does not modify until its completion is reported). The writer threads spend
their time in calls that release the GIL (hashing, write, fsync), so they do not stall
the engine thread.

Bound and drop policy: at most `max_pending_bytes` of payload is held (queued plus
those being written). A submit that does not fit is rejected, newest first: it
returns False and reports `ok=False, reason="queue full"`; what is already queued is
kept. An item larger than the whole bound is accepted only when the queue is empty.

Merging: a checkpoint submit cancels a queued, not yet started checkpoint (one still
waiting for what was submitted before it) of the same key and of every key in
`supersedes` (reported `reason="superseded"`), but only if the new one is accepted. A
chunk submit of a key already queued with the same provenance rides on the queued write.

Order: first in, first out, so a checkpoint submitted after its chunks is published
after they are written. Chunk writes overlap (each is crash-safe on its own: temporary
file, fsync, rename). A checkpoint waits on the publisher thread until everything
submitted before it has finished, while later chunks go on; a task waits for everything
before it, and so does a chunk write of a key in flight or named by a checkpoint in
flight. Completions are reported in submission order whatever order the writes finish
in. Why parallel: one file at a time leaves the disk idle during each fsync and each
file's Python work (benchmarks/results_store.md). A checkpoint referencing a chunk that
this writer failed or rejected is not published (it could splice another computation's
bytes).

Completions: `on_done(key, ok, reason)` is called on the writer thread if given;
otherwise `Completion`s accumulate until `drain_finished()` (poll it every step).

Tasks: `submit_task(fn)` runs `fn(store)` on the writer thread in the same order
(deletes, resets), so a delete ordered after a write never overtakes it. Tasks are
never rejected and report no completion; an error is logged.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from histate_vllm.store.errors import StoreError
from histate_vllm.store.publish import payload_view
from histate_vllm.store.store import SSDStore
from histate_vllm.store.threads import executor, start_thread

logger = logging.getLogger(__name__)

# Chunk keys whose write failed or was rejected, remembered until a later write of
# the key succeeds (oldest forgotten first beyond this many).
_MAX_FAILED_CHUNKS = 16384


@dataclass(frozen=True, slots=True)
class Completion:
    key: bytes
    kind: str  # "chunk" or "checkpoint"
    ok: bool
    reason: str  # "" on success
    nbytes: int  # bytes on disk the entry occupies (0 on failure)


class _Item:
    __slots__ = (
        "ahead",
        "cancelled",
        "chunk_keys",
        "finished",
        "fn",
        "key",
        "kind",
        "nbytes",
        "payload",
        "position",
        "provenance",
        "result",
        "waiters",
    )  # fmt: skip

    def __init__(self, kind, key, payload, provenance, position=0, chunk_keys=()):
        self.kind = kind
        self.key = key
        self.payload = payload
        self.nbytes = len(payload)
        self.provenance = provenance
        self.position = position
        self.chunk_keys = chunk_keys
        self.ahead = False  # a checkpoint's state written ahead of its chunks
        self.cancelled = False
        self.waiters = 1  # submits this write answers
        self.fn = None  # a task: called with the store
        self.result: tuple[bool, str, int] | None = None  # set once written
        self.finished = threading.Event()  # set with `result`: what a checkpoint waits on


class StoreWriter:
    def __init__(
        self,
        store: SSDStore,
        *,
        max_pending_bytes: int,
        on_done: Callable[[bytes, bool, str], None] | None = None,
        name: str = "histate-store-writer",
        io_threads: int = 4,
    ) -> None:
        self.store = store
        self.max_pending_bytes = max_pending_bytes
        self.on_done = on_done
        lock = threading.Lock()
        # Two conditions on one lock, so that a submit wakes only the dispatcher: waking
        # every writer thread on each submit has them all contend for the GIL with the
        # engine thread.
        self._cv = threading.Condition(lock)  # the queue: new items, closing
        self._done = threading.Condition(lock)  # items finishing
        self._queue: deque[_Item] = deque()
        self._queued_ckpt: dict[bytes, _Item] = {}
        # Chunk writes queued or in flight, by key.
        self._open_chunks: dict[bytes, _Item] = {}
        self._failed_chunks: OrderedDict[bytes, str] = OrderedDict()
        self._pending_bytes = 0
        # Dispatched items in submission order, until their completion is reported.
        self._running: deque[_Item] = deque()
        self._emit_lock = threading.Lock()  # completions leave in submission order
        self._io = (
            executor(io_threads, f"{name}-io", writes=True)
            if io_threads > 1
            else None
        )
        # Checkpoints wait for their chunks here, so later chunks need not wait for them.
        self._publisher = (
            executor(1, f"{name}-publish", writes=True)
            if self._io is not None
            else None
        )
        self._finished: list[Completion] = []
        self._closed = False
        self.stats = dict.fromkeys(
            ("submitted", "written", "rejected", "superseded", "failed", "bytes_written"), 0
        )
        self._thread = start_thread(self._run, name=name, writes=True)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    # -- engine thread ------------------------------------------------------------

    def submit_chunk(self, key: bytes, payload, *, provenance: str) -> bool:
        """Queue a chunk write; False if rejected (queue full)."""
        mv = payload_view(payload)
        with self._cv:
            self._check_open()
            self.stats["submitted"] += 1
            dup = self._open_chunks.get(key)
            if dup is not None and dup.provenance == provenance:
                dup.waiters += 1
                return True
            if not self._fits(len(mv), 0):
                self._reject_locked(key)
                rejected = Completion(key, "chunk", False, "queue full", 0)
            else:
                item = _Item("chunk", key, mv, provenance)
                self._enqueue_locked(item)
                self._open_chunks[key] = item
                return True
        self._emit([rejected])
        return False

    def submit_checkpoint(
        self,
        key: bytes,
        payload,
        *,
        position: int,
        chunk_keys: Sequence[bytes],
        provenance: str,
        supersedes: Sequence[bytes] = (),
        ahead: bool = False,
    ) -> bool:
        """Queue a checkpoint publish; False if rejected (queue full). `ahead`: write
        only its state, ahead of `chunk_keys` (see SSDStore.write_state_ahead)."""
        mv = payload_view(payload)
        done: list[Completion] = []
        with self._cv:
            self._check_open()
            self.stats["submitted"] += 1
            old = [self._queued_ckpt[k] for k in {key, *supersedes} if k in self._queued_ckpt]
            accepted = self._fits(len(mv), sum(it.nbytes for it in old))
            if not accepted:
                self.stats["rejected"] += 1
                done.append(Completion(key, "checkpoint", False, "queue full", 0))
            else:
                for it in old:
                    it.cancelled = True
                    del self._queued_ckpt[it.key]
                    self._pending_bytes -= it.nbytes
                    it.payload = None
                    self.stats["superseded"] += 1
                    done.append(Completion(it.key, "checkpoint", False, "superseded", 0))
                item = _Item("checkpoint", key, mv, provenance, position,
                             () if ahead else tuple(chunk_keys))
                item.ahead = ahead
                self._enqueue_locked(item)
                self._queued_ckpt[key] = item
        self._emit(done)
        return accepted

    def submit_task(self, fn: Callable[[SSDStore], object], *, what: str) -> None:
        """Run `fn(self.store)` on the writer thread after everything queued before it."""
        with self._cv:
            self._check_open()
            item = _Item("task", b"", b"", what)
            item.fn = fn
            self._enqueue_locked(item)

    def drain_finished(self) -> list[Completion]:
        """Completions reported since the last call (when no `on_done` was given)."""
        with self._cv:
            out, self._finished = self._finished, []
        return out

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is written; False on timeout."""
        with self._cv:
            return self._done.wait_for(lambda: not self._queue and not self._running, timeout)

    def idle(self) -> bool:
        """Nothing queued or running, and every completion drained."""
        with self._cv:
            return not (self._queue or self._running or self._finished)

    def wait_finished(self, timeout: float) -> bool:
        """Block until a completion waits in drain_finished(), nothing is queued or
        running, or `timeout` passed; True unless it timed out."""
        with self._cv:
            return self._done.wait_for(
                lambda: self._finished or not (self._queue or self._running), timeout)

    def close(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting; write what is queued (drain) or cancel it, then stop."""
        done: list[Completion] = []
        with self._cv:
            self._closed = True
            if not drain:
                while self._queue:
                    it = self._queue.popleft()
                    if it.cancelled:
                        continue
                    self._pending_bytes -= it.nbytes
                    if self._open_chunks.get(it.key) is it:
                        del self._open_chunks[it.key]
                    it.payload = None
                    if it.kind == "task":
                        continue  # a dropped task reports nothing
                    done += [Completion(it.key, it.kind, False, "writer closed", 0)] * it.waiters
                self._queued_ckpt.clear()
            self._cv.notify_all()
            self._done.notify_all()
        self._emit(done)
        self._thread.join(timeout)
        for pool in (self._io, self._publisher):
            if pool is not None:
                pool.shutdown(wait=not self._thread.is_alive())

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("StoreWriter is closed")

    def _fits(self, nbytes: int, freed: int) -> bool:
        pending = self._pending_bytes - freed
        return pending == 0 or pending + nbytes <= self.max_pending_bytes

    def _reject_locked(self, key: bytes) -> None:
        self.stats["rejected"] += 1
        self._remember_failed(key, "rejected: queue full")

    def _enqueue_locked(self, item: _Item) -> None:
        self._queue.append(item)
        self._pending_bytes += item.nbytes
        self._cv.notify()  # the dispatcher is the only waiter

    def _remember_failed(self, key: bytes, reason: str) -> None:
        self._failed_chunks[key] = reason
        self._failed_chunks.move_to_end(key)
        while len(self._failed_chunks) > _MAX_FAILED_CHUNKS:
            self._failed_chunks.popitem(last=False)

    def _emit(self, done: list[Completion]) -> None:
        if not done:
            return
        if self.on_done is None:
            with self._cv:
                self._finished.extend(done)
            return
        for c in done:
            try:
                self.on_done(c.key, c.ok, c.reason)
            except Exception:
                logger.exception("store writer: on_done callback failed")

    # -- writer thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    if self._running:  # closing: let the writes in flight finish
                        self._done.wait_for(lambda: not self._running)
                    return
                item = self._queue[0]
                if not item.cancelled and self._must_wait(item):
                    self._done.wait_for(lambda: not self._running)
                    continue  # the queue may have changed meanwhile: look again
                self._queue.popleft()
                if item.cancelled:
                    if not self._queue:
                        self._done.notify_all()  # flush() may be waiting for this
                    continue
                # Everything before it that has not finished (a checkpoint waits for it).
                before = [it for it in self._running if it.result is None]
                self._running.append(item)
                store = self.store
            if item.kind == "task":
                self._run_task(item)
            elif item.kind == "chunk" and self._io is not None:
                self._io.submit(self._write, store, item, None)
            elif item.kind == "checkpoint" and self._publisher is not None:
                self._publisher.submit(self._publish, store, item, before)
            else:
                self._publish(store, item, before)

    def _must_wait(self, item: _Item) -> bool:
        """Whether `item` has to wait, on this thread, for everything dispatched before it.

        With I/O threads, a chunk waits only for a write of its key or a checkpoint naming
        it; a checkpoint waits on the publisher thread instead (see `_publish`)."""
        if not self._running:
            return False
        if item.kind == "task" or self._io is None:
            return True
        if item.kind == "checkpoint":
            return False
        return any(
            it.key == item.key or (it.kind == "checkpoint" and item.key in it.chunk_keys)
            for it in self._running
        )

    def _publish(self, store: SSDStore, item: _Item, before: list[_Item]) -> None:
        """Publish a checkpoint once everything submitted before it has finished. Until
        then it can still be superseded: it stays in `_queued_ckpt`."""
        for it in before:  # woken by these items only, not by every write that finishes
            it.finished.wait()
        with self._cv:
            if self._queued_ckpt.get(item.key) is item:
                del self._queued_ckpt[item.key]
            cancelled = item.cancelled  # superseded meanwhile, and reported so
            if cancelled:
                item.result = (False, "superseded", 0)
                item.finished.set()
            blocked = next((k for k in item.chunk_keys if k in self._failed_chunks), None)
            if blocked is not None:
                why = self._failed_chunks[blocked]
                blocked = f"chunk {blocked.hex()[:16]}… not written ({why})"
        if cancelled:
            self._report()
        else:
            self._write(store, item, blocked)

    def _write(self, store: SSDStore, item: _Item, blocked: str | None) -> None:
        ok, reason, nbytes = self._execute(store, item, blocked)
        with self._cv:
            self._pending_bytes -= item.nbytes
            item.payload = None
            if item.kind == "chunk":
                if self._open_chunks.get(item.key) is item:
                    del self._open_chunks[item.key]  # no more merging into it
                if ok:
                    self._failed_chunks.pop(item.key, None)
                else:
                    self._remember_failed(item.key, reason)
            self.stats["written" if ok else "failed"] += 1
            self.stats["bytes_written"] += nbytes
            item.result = (ok, reason, nbytes)
            item.finished.set()
        self._report()

    def _report(self) -> None:
        """Report finished items at the head of `_running`, in submission order.

        An item leaves `_running` only after its completion is out, so that after
        flush() every completion is in drain_finished() or was passed to on_done."""
        with self._emit_lock:
            with self._cv:
                items = []
                for it in self._running:
                    if it.result is None:
                        break
                    items.append(it)
            done = []
            for it in items:
                if it.kind != "task" and not it.cancelled:
                    ok, reason, nbytes = it.result
                    done += [Completion(it.key, it.kind, ok, reason, nbytes)] * it.waiters
            self._emit(done)
            with self._cv:
                for _ in items:
                    self._running.popleft()
                self._done.notify_all()

    def _run_task(self, item: _Item) -> None:
        try:
            item.fn(self.store)
        except Exception:
            logger.exception("store writer: %s failed; the store keeps working", item.provenance)
        with self._cv:
            item.fn = None
            item.result = (True, "", 0)
            item.finished.set()
        self._report()

    def _execute(
        self, store: SSDStore, item: _Item, blocked: str | None
    ) -> tuple[bool, str, int]:
        if blocked is not None:
            return False, blocked, 0
        try:
            if item.kind == "chunk":
                n = store.write_chunk(
                    item.key, item.payload, provenance=item.provenance, on_conflict="replace"
                )
            elif item.ahead:
                n = store.write_state_ahead(item.key, item.payload, provenance=item.provenance)
            else:
                n = store.publish_checkpoint(
                    item.key,
                    item.payload,
                    position=item.position,
                    chunk_keys=item.chunk_keys,
                    provenance=item.provenance,
                )
            return True, "", n
        except StoreError as e:
            return False, str(e), 0
        except Exception as e:
            logger.exception("store writer: unexpected error writing %s", item.kind)
            return False, f"internal error: {e!r}", 0
