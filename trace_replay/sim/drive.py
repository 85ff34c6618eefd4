"""One SSD whose reads and writes share its bandwidth, and the engine's bounded write queue.

Reads (restores) and writes (DRAM -> SSD copies) go to the same drive. Each direction is
served first in, first out; while both have work, each gets half of the drive's time (NVMe
interleaves the reader's and the writer's requests), otherwise the one with work gets all of
it. A read of n bytes needs n / read_bw seconds of drive time, a write n / write_bw.

Writes are submitted as the engine's `StoreWriter` (histate_vllm/store/writer.py) takes
them: at most `queue_bytes` of payload is held, queued plus being written, and a write that
does not fit is rejected, newest first (what is queued is kept); one larger than the whole
bound is accepted only when nothing is pending. `queue_bytes=None`: no bound (nothing is
dropped). `charge_writes=False`: writes take no drive time and are never dropped (the
simulator without a drive model).

Completions are collected by `advance` and handed back as (callback, argument) pairs for the
caller to run once the drive's state is settled (a callback may submit more work).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

_EPS = 1e-9  # s of drive time; float error on times of ~1e5 s is ~1e-11


class Drive:
    def __init__(self, read_bw: float, write_bw: float, *, queue_bytes: int | None,
                 charge_writes: bool = True):
        if read_bw <= 0 or write_bw <= 0:
            raise ValueError("drive bandwidths must be > 0")
        if queue_bytes is not None and queue_bytes <= 0:
            raise ValueError(f"queue_bytes must be > 0 or None, got {queue_bytes}")
        self.read_bw = read_bw
        self.write_bw = write_bw
        self.queue_bytes = queue_bytes
        self.charge_writes = charge_writes
        self.t = 0.0
        # [drive seconds left, callback, argument, bytes]
        self.reads: deque[list] = deque()
        self.writes: deque[list] = deque()
        self.pending_write_bytes = 0
        self.version = 0  # bumped whenever the next completion time may have changed
        self._done: list[tuple[Callable, object]] = []
        self.stats = {"read_bytes": 0, "written_bytes": 0, "write_bytes_dropped": 0,
                      "writes_dropped": 0, "writes": 0, "read_busy_s": 0.0,
                      "write_busy_s": 0.0}

    def _advance(self, now: float) -> None:
        """Serve both queues up to `now`, collecting completions."""
        while now > self.t and (self.reads or self.writes):
            queues = [q for q in (self.reads, self.writes) if q]
            n = len(queues)
            # Wall time until the first head finishes at 1/n of the drive each.
            dt = min(min(q[0][0] for q in queues) * n, now - self.t)
            for q in queues:
                head = q[0]
                head[0] -= dt / n
                key = "read_busy_s" if q is self.reads else "write_busy_s"
                self.stats[key] += dt / n
            self.t += dt
            for q in queues:
                while q and q[0][0] <= _EPS:
                    _, cb, arg, nbytes = q.popleft()
                    if q is self.writes:
                        self.pending_write_bytes -= nbytes
                        self.stats["written_bytes"] += nbytes
                    self._done.append((cb, arg))
        self.t = max(self.t, now)

    def read(self, now: float, nbytes: float, cb: Callable, arg: object) -> None:
        """Read `nbytes`; `cb(arg)` once read (returned by `advance`)."""
        self._advance(now)
        self.stats["read_bytes"] += nbytes
        self.reads.append([nbytes / self.read_bw, cb, arg, nbytes])
        self.version += 1

    def write(self, now: float, nbytes: int, cb: Callable, arg: object) -> bool:
        """Queue a write of `nbytes`; False if the queue rejects it (nothing is queued).
        `cb(arg)` once written (returned by `advance`; at once if writes are not charged)."""
        self.stats["writes"] += 1
        if not self.charge_writes:
            self.stats["written_bytes"] += nbytes
            self._done.append((cb, arg))
            return True
        self._advance(now)
        pending = self.pending_write_bytes
        if self.queue_bytes is not None and pending and pending + nbytes > self.queue_bytes:
            self.stats["writes_dropped"] += 1
            self.stats["write_bytes_dropped"] += nbytes
            return False
        self.pending_write_bytes += nbytes
        self.writes.append([nbytes / self.write_bw, cb, arg, nbytes])
        self.version += 1
        return True

    def advance(self, now: float) -> list[tuple[Callable, object]]:
        """Serve up to `now`; return the completions since the last call, in order."""
        self._advance(now)
        done, self._done = self._done, []
        if done:
            self.version += 1
        return done

    @property
    def has_done(self) -> bool:
        """Completions collected but not yet handed back by `advance`."""
        return bool(self._done)

    def next_completion(self) -> float | None:
        queues = [q for q in (self.reads, self.writes) if q]
        if not queues:
            return None
        return self.t + min(q[0][0] for q in queues) * len(queues)
