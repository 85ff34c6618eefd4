"""GPU page movers and a page checksum for the paged KV cache, installed as `histate_vllm.kernels`.

What the copy engine does badly: moving many small pages (one row of a paged cache tensor
per block id, or a byte range of each) costs one `cudaMemcpy` each. These kernels do it in
one launch:

* `gather_pages(cache, ids, offset, nbytes)` -> a contiguous uint8 buffer `[len(ids), nbytes]`
  holding bytes `[offset, offset + nbytes)` of page `cache[ids[i]]` in row `i`;
* `scatter_pages(cache, ids, buf, offset, nbytes)`, the reverse (ids should be distinct);
* `checksum_pages(cache, ids, offset, nbytes)` -> one 64-bit checksum per page (below).

A page is `cache[b]` for a tensor whose first dimension is the block and whose pages are each
contiguous (the first-dimension stride may be larger, as in vLLM's shared hybrid tensors).
Block ids must be in range: the Triton path does not check them (a check would wait on the
device), where torch's index ops raise.

Checksum ("hs32x2"): the byte range is read as little-endian uint32 words `w[0..m)`
(`offset` and `nbytes` must be multiples of 4) and

    a = sum(w[i])           mod 2**32
    b = sum((i + 1) * w[i]) mod 2**32
    checksum = b * 2**32 + a      (returned as int64 with that bit pattern)

Integer-only and order-independent in its sums, so a GPU computes it in parallel chunks and
`reference.checksum_bytes` (numpy) or `reference.checksum_pages` (torch) recompute it bit
for bit on a CPU. `b` weights each word by its position, so swapped words change it. It is
not the SSD store's checksum: the store (histate_vllm/store/format.py) checksums a payload
file's bytes with xxh3_64 (CRC32 without xxhash) and its headers/manifests with CRC32, on
the CPU. This one is for checking pages while they are still on the device, or across a
GPU/CPU hop; it does not change the on-disk format.

`pick_backend` chooses Triton for CUDA/ROCm tensors when triton imports, torch index ops
otherwise; `HISTATE_KERNELS=torch` forces the fallback.

This folder is `triton_kernels/` in the repository but must never be the top-level module
`triton_kernels`: vLLM imports a module of that name (MXFP4 MoE) in preference to its own.
"""

if __name__ == "triton_kernels":  # the repository root is on sys.path; step aside
    import importlib.util as _iu
    import os as _os
    import sys as _sys
    from importlib.machinery import PathFinder as _PathFinder

    _root = _os.path.dirname(_os.path.dirname(_os.path.realpath(__file__)))
    _path = [e for e in _sys.path if _os.path.realpath(e or ".") != _root]
    _spec = _PathFinder.find_spec("triton_kernels", _path)
    if _spec is not None and _spec.loader is not None:
        # The import system returns whatever sys.modules holds once this file has run.
        _real = _iu.module_from_spec(_spec)
        _sys.modules["triton_kernels"] = _real
        _spec.loader.exec_module(_real)
    elif _iu.find_spec("vllm") is not None and _iu.find_spec("vllm.third_party.triton_kernels"):
        import vllm.third_party.triton_kernels as _real

        _sys.modules["triton_kernels"] = _real
    else:
        raise ImportError(
            f"{__file__} is histate_vllm.kernels, not the triton_kernels package; "
            f"take {_root} off sys.path or install histate-vllm"
        )
else:
    from .dispatch import checksum_pages, gather_pages, pick_backend, scatter_pages

    __all__ = ["checksum_pages", "gather_pages", "pick_backend", "scatter_pages"]
