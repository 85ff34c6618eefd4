"""Page gather/scatter on a GPU: the Triton kernels against torch index ops and plain copies.

For each page size, `--count` pages picked at random (non-contiguous block ids) from a paged
uint8 cache of `--blocks` pages move to or from one contiguous buffer:

  triton      histate_vllm.kernels, backend "triton" (one launch)
  torch       torch.index_select / index_copy_ (the fallback the CPUs use)
  per-page    one tensor copy per page: what a copy-engine loop does
  d2d         one device-to-device copy of the same number of contiguous bytes: the
              bandwidth a perfect gather would reach, and the baseline of the ratios

plus the hs32x2 checksum over the same pages. Times are the median of `--iters` runs timed
with CUDA events after a warm-up; results are checked against torch before any timing.
Runs on CUDA and ROCm builds of torch; on a machine without a GPU it exits with a message.

    python benchmarks/gpu_transfer.py [--page-bytes 2048,16384,65536] [--count 512]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch


def _median_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(page_bytes: int, blocks: int, count: int, iters: int, offset: int) -> list[tuple]:
    from histate_vllm.kernels import checksum_pages, gather_pages, reference, scatter_pages

    dev = torch.device("cuda")
    cache = torch.randint(0, 256, (blocks, page_bytes), dtype=torch.uint8, device=dev)
    ids = torch.randperm(blocks, device=dev)[:count]
    ids_host = ids.tolist()
    nbytes = page_bytes - offset
    out = torch.empty(count, nbytes, dtype=torch.uint8, device=dev)
    flat = torch.empty_like(out)

    want = reference.gather_pages(cache, ids, offset, nbytes)
    if not torch.equal(gather_pages(cache, ids, offset, nbytes, backend="triton"), want):
        raise SystemExit(f"triton gather differs from torch at page {page_bytes}")
    if nbytes % 4 == 0 and offset % 4 == 0:
        got = checksum_pages(cache, ids, offset, nbytes, backend="triton")
        if not torch.equal(got, reference.checksum_pages(cache, ids, offset, nbytes)):
            raise SystemExit(f"triton checksum differs from torch at page {page_bytes}")

    def per_page_gather():
        for i, b in enumerate(ids_host):
            out[i].copy_(cache[b, offset:])

    def per_page_scatter():
        for i, b in enumerate(ids_host):
            cache[b, offset:].copy_(out[i])

    ops = {
        "d2d": lambda: flat.copy_(out),
        "gather triton": lambda: gather_pages(cache, ids, offset, nbytes, out, backend="triton"),
        "gather torch": lambda: gather_pages(cache, ids, offset, nbytes, out, backend="torch"),
        "gather per-page": per_page_gather,
        "scatter triton": lambda: scatter_pages(cache, ids, out, offset, nbytes, backend="triton"),
        "scatter torch": lambda: scatter_pages(cache, ids, out, offset, nbytes, backend="torch"),
        "scatter per-page": per_page_scatter,
    }
    if nbytes % 4 == 0 and offset % 4 == 0:
        ops["checksum triton"] = lambda: checksum_pages(cache, ids, offset, nbytes,
                                                        backend="triton")
    ms = {name: _median_ms(fn, iters) for name, fn in ops.items()}
    moved = count * nbytes
    return [(page_bytes, name, t * 1e3, moved / t / 1e6, t / ms["d2d"]) for name, t in ms.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page-bytes", default="2048,16384,65536")
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--count", type=int, default=512)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--offset", type=int, default=0, help="start of each page's byte range")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_transfer.py needs a CUDA or ROCm GPU; torch sees none here "
                 "(the kernels' CPU checks are tests/test_kernels.py)")
    print(f"device: {torch.cuda.get_device_name()}, {args.count} of {args.blocks} pages, "
          f"offset {args.offset}")
    print(f"{'page B':>8} {'op':<18} {'us':>10} {'GB/s':>8} {'x d2d':>7}")
    for page in (int(p) for p in args.page_bytes.split(",")):
        for page_bytes, name, us, gbs, ratio in run(page, args.blocks, args.count, args.iters,
                                                     args.offset):
            print(f"{page_bytes:>8} {name:<18} {us:>10.1f} {gbs:>8.1f} {ratio:>7.2f}")


if __name__ == "__main__":
    main()
