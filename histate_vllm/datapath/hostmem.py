"""Host rows the GPU copies from and to: the DRAM slot pool and the SSD staging ring.

Rows are page-aligned anonymous memory (an anonymous mmap, as the store's `aligned_buffer`;
not imported from it, so the data path runs without the store's dependencies), each starting on a 4 KiB page
(padded to whole pages): pages cost nothing until first written, the store writes and
reads every row with O_DIRECT without a copy, and the allocation is the rows asked for
(torch's pinned allocator rounds up to a power of two). For a GPU they are then registered
with the driver (pinned, `cudaHostRegister` through torch: no vLLM needed) in chunks of at
most 64 GiB, as vLLM registers its own offload region, so a DMA engine reads and writes them
directly and a copy never waits for the host.

Pinning never silently fails: a device-to-host copy into pageable memory is synchronous
and would stall the engine thread behind the model step. A chunk the driver refuses is
retried as smaller chunks (down to `MIN_REGISTER_BYTES`); if that fails too, `PinError`
stops start-up with what to change. Chunks end on row boundaries, so no row straddles two
registrations; `breaks` lists the rows where a registration starts, and a copy of a run
of rows is cut there.
"""

from __future__ import annotations

import mmap

import numpy as np
import torch

# vLLM's bound (`MAX_HOST_REGISTER_CHUNK_BYTES`): drivers refuse larger single ranges.
MAX_REGISTER_BYTES = 64 << 30
# The smallest chunk tried before giving up (then at least one row).
MIN_REGISTER_BYTES = 256 << 20
_PAGE = 4096


class PinError(RuntimeError):
    """Host rows could not be registered with the GPU driver."""


def _cudart():
    """The runtime's (or HIP's, on ROCm) host registration calls, through torch."""
    cudart = torch.cuda.cudart()

    def register(ptr: int, nbytes: int) -> int:
        return int(cudart.cudaHostRegister(ptr, nbytes, 0))

    def unregister(ptr: int) -> int:
        return int(cudart.cudaHostUnregister(ptr))

    return register, unregister


class HostRows:
    def __init__(self, num_rows: int, row_bytes: int, *, pin: bool, cudart=None):
        """cudart: (register(ptr, nbytes) -> error code, unregister(ptr) -> error code),
        by default the device runtime's; tests pass fakes."""
        self.stride = -(-row_bytes // _PAGE) * _PAGE
        nbytes = num_rows * self.stride
        whole = np.frombuffer(mmap.mmap(-1, max(nbytes, 1)), np.int8)[:nbytes]
        whole = whole.reshape(num_rows, self.stride)
        self.array = whole[:, :row_bytes]
        # A view of the whole buffer, so `padded` (whole rows, contiguous) shares its storage.
        self.padded = torch.from_numpy(whole)
        self.tensor = self.padded[:, :row_bytes]
        self._whole = whole
        self._registered: list[int] = []
        self._cudart = cudart
        self.breaks: tuple[int, ...] = ()  # rows where a registration starts (beyond row 0)
        # Per row, the end event of the last copy out of it (an SSD staging ring's use).
        self.filled: list = [None] * num_rows
        if pin and num_rows:
            self._register()

    @property
    def pinned(self) -> bool:
        return bool(self._registered)

    def _register(self) -> None:
        register, _ = self._cudart or _cudart()
        base, total, row = self._whole.ctypes.data, self._whole.nbytes, self.stride
        step = max(MAX_REGISTER_BYTES // row, 1) * row
        floor = max(MIN_REGISTER_BYTES // row, 1) * row
        todo = [(o, min(step, total - o)) for o in range(0, total, step)]
        starts = []
        while todo:
            offset, size = todo.pop(0)
            err = register(base + offset, size)
            if err == 0:
                self._registered.append(base + offset)
                starts.append(offset // row)
                continue
            half = (size // row // 2) * row
            if size > floor and half:
                todo[:0] = [(offset, half), (offset + half, size - half)]
                continue
            self.close()
            raise PinError(
                f"HiState: the GPU driver refused to pin {size:,} bytes of host memory "
                f"(error {err}) after pinning {len(self._registered)} chunks of a "
                f"{total:,}-byte pool. Copies into pageable memory would stall the "
                "engine step; lower dram_bytes, or raise the locked-memory limit "
                "(ulimit -l, a container's memlock)"
            )
        self.breaks = tuple(sorted(starts))[1:]

    def close(self) -> None:
        if self._registered:
            _, unregister = self._cudart or _cudart()
            for address in reversed(self._registered):
                unregister(address)
            self._registered = []
