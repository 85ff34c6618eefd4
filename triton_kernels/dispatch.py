"""One entry point per operation: Triton on a CUDA/ROCm tensor when triton imports, else torch."""

from __future__ import annotations

import os

import torch

from . import reference


def _triton():
    try:
        from . import triton_impl
    except ImportError:  # no triton (CPU-only installs); the torch ops serve
        return None
    return triton_impl


def pick_backend(cache: torch.Tensor) -> str:
    if os.environ.get("HISTATE_KERNELS") == "torch":
        return "torch"
    # ROCm builds of torch report their GPUs as device type "cuda" too.
    if cache.device.type == "cuda" and _triton() is not None:
        return "triton"
    return "torch"


def _impl(cache, backend):
    backend = backend or pick_backend(cache)
    if backend == "torch":
        return reference
    if backend == "triton":
        impl = _triton()
        if impl is None:
            raise RuntimeError("backend 'triton' asked for, but triton does not import")
        return impl
    raise ValueError(f"unknown backend {backend!r}")


def gather_pages(cache, ids, offset=0, nbytes=None, out=None, *, backend=None) -> torch.Tensor:
    return _impl(cache, backend).gather_pages(cache, ids, offset, nbytes, out)


def scatter_pages(cache, ids, buf, offset=0, nbytes=None, *, backend=None) -> None:
    _impl(cache, backend).scatter_pages(cache, ids, buf, offset, nbytes)


def checksum_pages(cache, ids, offset=0, nbytes=None, *, backend=None) -> torch.Tensor:
    return _impl(cache, backend).checksum_pages(cache, ids, offset, nbytes)
