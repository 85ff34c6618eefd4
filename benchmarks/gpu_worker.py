"""The worker's data path on a GPU: stores and restores against one plain copy of the bytes.

Builds a paged cache like vLLM's (`--layers` tensors of `--blocks` pages; a key is one page
of every layer), then times, through `HiStateWorker` as the engine drives it (submit, poll
`get_finished` until the job is reported):

  store           GPU pages -> pinned DRAM slots (one batched copy per job)
  load dram       pinned DRAM slots -> GPU pages
  load ssd        SSD files -> pinned staging -> GPU pages (reads in parallel, verified)

against the same bytes moved by one contiguous copy between pinned host memory and the
device (`memcpy d2h`, `memcpy h2d`), and, for the SSD restore, the store's own parallel
read of the same files into host memory (`ssd read only`). Every job's bytes are checked
after it is reported. SSD files are dropped from the page cache before each restore.

On a machine without a GPU it runs the same path on the CPU (synchronous copies), which
checks the script, not the hardware.

    python benchmarks/gpu_worker.py [--keys 64] [--layers 12] [--page-kib 256] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from histate_vllm.store import SSDStore, StoreIdentity  # noqa: E402
from histate_vllm.vllm_glue.transfer_specs import HiStateLoadSpec, HiStateStoreSpec  # noqa: E402
from histate_vllm.vllm_glue.worker import HiStateWorker  # noqa: E402


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_job(w: HiStateWorker, job_id: int, submit) -> float:
    t = time.perf_counter()
    submit()
    while True:
        done = w.get_finished()
        if done:
            [r] = done
            assert r.job_id == job_id and r.success, r
            return time.perf_counter() - t
        time.sleep(0.0001)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=64, help="keys per job")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--page-kib", type=int, default=256, help="bytes of one layer's page")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the SSD store goes")
    args = ap.parse_args()
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":
        torch.set_num_threads(1)  # a dry run: torch's threads stall on a busy shared CPU
    page = args.page_kib << 10
    blocks = 2 * args.keys + 1
    caches = [torch.randint(-128, 127, (blocks, page), dtype=torch.int8, device=dev)
              for _ in range(args.layers)]
    kv = SimpleNamespace(
        tensors=[SimpleNamespace(tensor=c, page_size_bytes=page) for c in caches],
        group_data_refs=[[SimpleNamespace(tensor_idx=i, page_size_bytes=page)
                          for i in range(args.layers)]],
    )
    key_bytes = page * args.layers
    work = tempfile.mkdtemp(prefix="gpu_worker-", dir=args.dir)
    ident = StoreIdentity(model="bench", dtype="int8", kv_layout="NHD", block_size=1,
                          tp_rank=0, tp_size=1, page_bytes=key_bytes, vllm_version="bench")
    store = SSDStore(work, ident, budget_bytes=1 << 50)
    w = HiStateWorker(kv, key_bytes=key_bytes, num_slots=args.keys, store=store,
                      ssd_queue_bytes=2 * args.keys * key_bytes)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (no GPU: a dry run)"
    print(f"device: {name}, copier {w.copier.backend}, DRAM pool pinned: {w._pool.pinned}; "
          f"{args.keys} keys x {args.layers} layers x {args.page_kib} KiB = "
          f"{args.keys * key_bytes / 2**20:.0f} MiB per job")
    src = list(range(args.keys))
    dst = list(range(args.keys, 2 * args.keys))
    slots = list(range(args.keys))
    keys = [i.to_bytes(4, "big") * 9 for i in range(args.keys)]
    gpu = lambda ids: GPULoadStoreSpec(ids, group_sizes=[len(ids)], block_indices=[0])  # noqa: E731
    want = [torch.cat([c[b] for c in caches]).cpu() for b in src]
    nbytes = args.keys * key_bytes
    times: dict[str, list[float]] = {}
    job = 0

    def check(name: str) -> None:
        for k, b in enumerate(dst):
            got = torch.cat([c[b] for c in caches]).cpu()
            if not torch.equal(got, want[k]):
                raise SystemExit(f"{name}: key {k} differs after the job was reported done")
        for c in caches:
            c[dst] = 0
        sync(dev)

    host = torch.empty(nbytes, dtype=torch.int8, pin_memory=dev.type == "cuda")
    flat = torch.empty(nbytes, dtype=torch.int8, device=dev)
    for _ in range(args.iters):
        job += 1
        sync(dev)
        times.setdefault("store", []).append(run_job(
            w, job, lambda: w.submit_store(job, gpu(src), HiStateStoreSpec(slots=slots))))
        job += 1
        times.setdefault("load dram", []).append(run_job(w, job, lambda: w.submit_load(
            job, HiStateLoadSpec(slots=slots, keys=keys, is_state=[False] * args.keys),
            gpu(dst))))
        check("load dram")
        for k, s in zip(keys, slots):
            store.write_chunk(k, w._dram_np[s], provenance="bench")
        for k in keys:
            path = store.layout.chunk_path(k)
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        job += 1
        times.setdefault("load ssd", []).append(run_job(w, job, lambda: w.submit_load(
            job, HiStateLoadSpec(slots=[-1] * args.keys, keys=keys,
                                 is_state=[False] * args.keys), gpu(dst))))
        check("load ssd")
        from histate_vllm.store import Read, aligned_buffer

        ring = [aligned_buffer(key_bytes) for _ in range(4)]
        for k in keys:
            fd = os.open(store.layout.chunk_path(k), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        t = time.perf_counter()
        for _ in store.read_many([Read(k, False, ring[i % 4]) for i, k in enumerate(keys)]):
            pass
        times.setdefault("ssd read only", []).append(time.perf_counter() - t)
        for k in keys:
            store.delete_chunk(k)
        for name, fn in (("memcpy d2h", lambda: host.copy_(flat, non_blocking=True)),
                         ("memcpy h2d", lambda: flat.copy_(host, non_blocking=True))):
            sync(dev)
            t = time.perf_counter()
            fn()
            sync(dev)
            times.setdefault(name, []).append(time.perf_counter() - t)
    w.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = {"store": "memcpy d2h", "load dram": "memcpy h2d", "load ssd": "ssd read only"}
    print(f"medians of {args.iters}:")
    for k, s in med.items():
        ratio = f"{med[ref[k]] / s:6.0%} of {ref[k]}" if k in ref else ""
        print(f"  {k:<14} {s * 1e3:8.2f} ms {nbytes / s / 2**30:7.2f} GiB/s  {ratio}")


if __name__ == "__main__":
    main()
