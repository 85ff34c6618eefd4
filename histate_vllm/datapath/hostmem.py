"""Host rows the GPU copies from and to: the DRAM slot pool and the SSD staging ring.

Rows are page-aligned anonymous memory (`aligned_buffer`), each starting on a 4 KiB page
(padded to whole pages): pages cost nothing until first written, the store writes and
reads every row with O_DIRECT without a copy, and the allocation is the rows asked for
(torch's pinned allocator rounds up to a power of two). For a
GPU they are then registered with the driver (pinned) in chunks of at most 64 GiB, as vLLM
registers its own offload region: a DMA engine reads and writes them directly, with no
pageable bounce. Registration that fails leaves them pageable: copies still work, slower.
"""

from __future__ import annotations

import numpy as np
import torch

from histate_vllm.store import aligned_buffer

# vLLM's bound (`MAX_HOST_REGISTER_CHUNK_BYTES`): drivers refuse larger single ranges.
MAX_REGISTER_BYTES = 64 << 30
_PAGE = 4096


class HostRows:
    def __init__(self, num_rows: int, row_bytes: int, *, pin: bool):
        stride = -(-row_bytes // _PAGE) * _PAGE
        whole = aligned_buffer(num_rows * stride).view(np.int8).reshape(num_rows, stride)
        self.array = whole[:, :row_bytes]
        self.tensor = torch.from_numpy(self.array)
        self._whole = whole
        self._registered: list[int] = []
        # Per row, the end event of the last copy out of it (an SSD staging ring's use).
        self.filled: list = [None] * num_rows
        if pin and num_rows:
            self._register(stride)

    @property
    def pinned(self) -> bool:
        return bool(self._registered)

    def _register(self, row_bytes: int) -> None:
        from vllm.logger import init_logger
        from vllm.v1.kv_offload.cpu.host_register import host_register, host_unregister

        base, total = self._whole.ctypes.data, self._whole.nbytes
        # Chunks end on row boundaries: no single row's copy straddles two registrations.
        step = max(MAX_REGISTER_BYTES // row_bytes, 1) * row_bytes
        for offset in range(0, total, step):
            if host_register(base + offset, min(step, total - offset)):
                self._registered.append(base + offset)
                continue
            init_logger(f"vllm.{__name__}").warning(
                "HiState: could not pin %.2f GB of host memory; copies stay pageable "
                "(slower)", total / 1e9,
            )
            for address in reversed(self._registered):
                host_unregister(address)
            self._registered = []
            return

    def close(self) -> None:
        if self._registered:
            from vllm.v1.kv_offload.cpu.host_register import host_unregister

            for address in reversed(self._registered):
                host_unregister(address)
            self._registered = []
