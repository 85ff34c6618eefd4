"""FleetLink: an engine's traffic with the fleet tier, off the scheduler's thread.

The scheduler never waits on the fleet tier: a request whose local hit falls short asks
(`fetch`), is deferred while the answer is pending, and goes on without the fleet tier once
its deadline passes. One thread answers fetches in order: which of the request's candidate
checkpoints the tier holds (one batched existence query), then a pull of the deepest one
the cost model prefers to recomputation, into the engine's own SSD stores (every rank's
shard, or none). Another thread publishes what the engine wrote to SSD. Pulled checkpoints
are handed back to the scheduler's thread (`take_pulled`), which admits them to its books;
nothing here touches the books.

Bandwidth and latency of the tier are measured from this engine's own pulls and publishes
(`speed`), not configured.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from histate_vllm.store.errors import StoreError
from histate_vllm.store.fleet import objects
from histate_vllm.store.fleet.backends import FleetUnavailable
from histate_vllm.store.fleet.sync import Pulled, publish_from_store, pull_into_store
from histate_vllm.store.fleet.tier import FleetMiss, FleetTier

logger = logging.getLogger(__name__)

PUBLISH_QUEUE = 256  # checkpoints waiting to be published; more are skipped (counted)


@dataclass
class Speed:
    """Exponentially weighted bandwidth (bytes/s) and per-checkpoint latency (s)."""

    bandwidth: float | None = None
    latency: float | None = None
    alpha: float = 0.3

    def add(self, nbytes: int, seconds: float, ops: int) -> None:
        """One transfer: a large one (1 MiB or more) measures bandwidth, a small one the
        latency of each of its `ops` checkpoints."""
        if seconds <= 0:
            return
        if nbytes >= (1 << 20):
            self.bandwidth = self._ewma(self.bandwidth, nbytes / seconds)
        else:
            self.latency = self._ewma(self.latency, seconds / max(ops, 1))

    def _ewma(self, old: float | None, x: float) -> float:
        return x if old is None else (1 - self.alpha) * old + self.alpha * x

    def seconds(self, nbytes: int) -> float | None:
        """Estimated time to move `nbytes` (None until measured)."""
        if self.bandwidth is None:
            return None
        return (self.latency or 0.0) + nbytes / self.bandwidth


@dataclass
class Fetch:
    """One request's ask: `candidates` (position, the checkpoint keys every rank and state
    group needs there) deepest first; `worth(position)`: whether pulling it beats
    recomputing, asked with the measured speed."""

    req_id: str
    candidates: list[tuple[int, list[bytes]]]
    worth: Callable[[int], bool]
    deadline: float
    pull_timeout_s: float = 30.0
    done: bool = False
    pulled: list[Pulled] = field(default_factory=list)


class FleetLink:
    def __init__(self, tiers: Sequence[FleetTier], stores: Sequence[Callable[[], object]]):
        """tiers[r], stores[r](): rank r's view of the fleet tier and its local SSD store
        (opened on first use: another rank's store may not exist when this starts)."""
        self.tiers = list(tiers)
        self._stores = list(stores)
        self._opened: dict[int, object] = {}
        self.counts: Counter = Counter()  # ("fetch" | "pull" | "publish", outcome)
        self.pull_speed = Speed()
        self.publish_speed = Speed()
        self._fetches: queue.Queue = queue.Queue()
        self._publishes: queue.Queue = queue.Queue(maxsize=PUBLISH_QUEUE)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._pulled: list[Pulled] = []
        self._open: dict[str, Fetch] = {}
        self._closed = False
        self.enabled = True
        self._threads = [
            threading.Thread(target=self._run, args=(self._fetches, self._fetch),
                             name="histate-fleet-fetch", daemon=True),
            threading.Thread(target=self._run, args=(self._publishes, self._publish),
                             name="histate-fleet-publish", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # --- the scheduler's side (never blocks) ---

    def fetch(self, req_id: str, candidates: list[tuple[int, list[bytes]]],
              worth: Callable[[int], bool], lookup_timeout_s: float,
              pull_timeout_s: float) -> None:
        """Ask for a request's deepest candidate: the request waits at most
        `lookup_timeout_s` for the answer, and `pull_timeout_s` more for a pull."""
        f = Fetch(req_id, candidates, worth, time.monotonic() + lookup_timeout_s,
                  pull_timeout_s)
        with self._lock:
            self._open[req_id] = f
        self._fetches.put(f)

    def status(self, req_id: str) -> str | None:
        """"pending" while a request's fetch may still bring something, "done" once it
        has (or timed out: counted), None for a request with no fetch."""
        with self._lock:
            f = self._open.get(req_id)
            if f is None:
                return None
            if f.done:
                return "done"
            if time.monotonic() >= f.deadline:
                self.counts["fetch", "deadline"] += 1
                f.deadline = float("inf")  # counted once; its pull still lands later
                self._open.pop(req_id)
                return "done"
            return "pending"

    def forget(self, req_id: str) -> None:
        with self._lock:
            self._open.pop(req_id, None)

    def take_pulled(self) -> list[Pulled]:
        with self._lock:
            out, self._pulled = self._pulled, []
        return out

    def publish(self, key: bytes) -> None:
        if not self.enabled:
            return
        try:
            self._publishes.put_nowait(key)
        except queue.Full:
            self.counts["publish", "skipped_busy"] += 1

    def wait(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for a fetch to finish (an idle scheduler's step)."""
        with self._done:
            if any(not f.done for f in self._open.values()):
                self._done.wait(timeout_s)

    def disable(self, why: str) -> None:
        """Stop using the tier for this engine (e.g. its weights were replaced in place)."""
        if self.enabled:
            self.enabled = False
            logger.warning("HiState fleet tier: off for this engine: %s", why)

    def drain(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the publishes queued so far; whether they all ran."""
        end = time.monotonic() + timeout_s
        while self._publishes.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)
        return not self._publishes.unfinished_tasks

    def close(self) -> None:
        self._closed = True
        self._fetches.put(None)
        try:
            self._publishes.put_nowait(None)
        except queue.Full:
            pass

    # --- the threads ---

    def _run(self, q: queue.Queue, handle) -> None:
        while True:
            item = q.get()
            if item is None or self._closed:
                return
            try:
                handle(item)
            except Exception:  # a bug must not kill the thread: the engine serves on
                logger.exception("HiState fleet tier: %s failed", handle.__name__)
                if isinstance(item, Fetch):
                    self._finish(item)
            finally:
                q.task_done()

    def _store(self, rank: int):
        s = self._opened.get(rank)
        if s is None:
            s = self._opened[rank] = self._stores[rank]()
        return s

    def _finish(self, f: Fetch) -> None:
        with self._done:
            f.done = True
            self._pulled.extend(f.pulled)
            self._done.notify_all()

    def _fetch(self, f: Fetch) -> None:
        try:
            if not self.enabled or time.monotonic() >= f.deadline:
                self.counts["fetch", "skipped"] += 1
                return
            ranks = range(len(self.tiers))
            keys = [k for _, ks in f.candidates for k in ks]
            try:
                there = dict(zip(keys, self._exists(keys)))
            except FleetUnavailable:
                self.counts["fetch", "unavailable"] += 1
                return
            for position, ks in f.candidates:
                if not all(there[k] for k in ks):
                    continue
                if not f.worth(position):
                    self.counts["fetch", "not_worth"] += 1
                    return
                with self._lock:  # the request waits for the pull, unless it went on
                    if f.deadline != float("inf"):
                        f.deadline = time.monotonic() + f.pull_timeout_s
                pulled = self._pull(ks, ranks)
                if pulled is None:  # counted by cause; a shallower one would share it
                    self.counts["fetch", "failed"] += 1
                    return
                f.pulled = pulled
                self.counts["fetch", "pulled"] += 1
                return
            self.counts["fetch", "none"] += 1
        finally:
            self._finish(f)

    def _exists(self, keys: list[bytes]) -> list[bool]:
        """Whether every rank's shard of each checkpoint is in the tier."""
        out = [True] * len(keys)
        for tier in self.tiers:
            names = [objects.manifest_name(tier.identity, k) for k in keys]
            out = [a and b for a, b in zip(out, tier.backend.exists(names))]
        return out

    def _pull(self, keys: list[bytes], ranks) -> list[Pulled] | None:
        """Every rank's shard of every key (a checkpoint's state groups), or none of them."""
        t0 = time.perf_counter()
        done: list[tuple[int, Pulled]] = []
        try:
            for key in keys:
                for r in ranks:
                    done.append((r, pull_into_store(self.tiers[r], self._store(r), key)))
        except FleetMiss as miss:
            self.counts["pull", miss.cause] += 1
            for r, p in done:  # not every shard: the others must not be restored alone
                try:
                    self._store(r).delete_checkpoint(p.key)
                except StoreError as e:  # its next start removes it as unreconciled
                    logger.debug("HiState fleet tier: partial pull left behind: %s", e)
            return None
        nbytes = sum(p.nbytes for _, p in done)
        self.pull_speed.add(nbytes, time.perf_counter() - t0, len(keys))
        self.counts["pull", "ok"] += 1
        self.counts["pull", "bytes"] += nbytes
        return [p for r, p in done if r == 0]

    def _publish(self, key: bytes) -> None:
        if not self.enabled:
            return
        t0 = time.perf_counter()
        sent = 0
        for r, tier in enumerate(self.tiers):
            sent += publish_from_store(tier, self._store(r), key)
        self.publish_speed.add(sent, time.perf_counter() - t0, 1)
        self.counts["publish", "bytes"] += sent
