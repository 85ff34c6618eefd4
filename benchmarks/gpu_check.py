"""The GPU check: HiState's data path on one GPU with torch and Triton alone (no vLLM).

    python benchmarks/gpu_check.py              # on a GPU: under 5 minutes
    python benchmarks/gpu_check.py --dry-run    # small sizes; automatic without a GPU

Prints PASS, FAIL or SKIP per check, then a table of ratios; exits 1 if any check failed.

  kernels    the Triton gather/scatter/checksum against the torch reference on the device:
             odd page sizes, byte ranges, unsorted ids, block stride larger than the page,
             outputs poisoned before each run, and pages past 2**31 elements
  store      GPU -> DRAM on a non-default compute stream: a long kernel is queued, then
             the pages are written, then the store is submitted; the host rows must hold
             what compute wrote, and the submit call must return without waiting
  load       DRAM -> GPU: a long kernel, then a zeroing of the blocks, then the load; the
             blocks must hold the loaded bytes (nothing overtook the copy), and the submit
             call must return without waiting
  groups     both above with two groups aliasing one tensor (an attention group and a state
             group on different blocks, different page sizes, block stride > either page)
  pointers   the same through vLLM 0.34's copy contract: each job's blocks given as page
             addresses (DevicePointers), read back as the worker does and checked (an
             address off by one byte refused); two groups on a tensor per layer, and aliased
  bandwidth  DRAM -> GPU and GPU -> DRAM through the copier against one plain pinned
             cudaMemcpy of the same bytes; SSD -> GPU through the store's read pipeline
             against a raw O_DIRECT read of the same files (needs the store's msgspec)

The dry run (CPU, or --dry-run) runs every check on small sizes with the CPU stream and the
Triton interpreter, so the script stays runnable: tests/benchmarks/test_gpu_check.py runs
it with vLLM made unimportable. Timing checks and the 2**31 case need a GPU and are SKIP
there; its ratios are printed but mean nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def use_checkout() -> None:
    """Run from a checkout with nothing installed: the repository on the path, and
    histate_vllm.kernels loaded from triton_kernels/, where an install would map it."""
    import importlib.util

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if importlib.util.find_spec("histate_vllm.kernels") is not None:
        return  # installed (or editable): the install maps it
    spec = importlib.util.spec_from_file_location(
        "histate_vllm.kernels", REPO / "triton_kernels" / "__init__.py",
        submodule_search_locations=[str(REPO / "triton_kernels")])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


use_checkout()


class Skip(Exception):
    pass


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="small sizes (default without a GPU)")
    p.add_argument("--ssd-dir", default=None, help="where the SSD check writes (a temp dir)")
    p.add_argument("--keys", type=int, default=None, help="keys per bandwidth run")
    return p.parse_args(argv)


class Ctx:
    def __init__(self, dry: bool, ssd_dir: str | None, keys: int | None):
        import torch

        self.torch = torch
        self.dry = dry
        self.gpu = torch.cuda.is_available() and not dry
        self.device = torch.device("cuda" if self.gpu else "cpu")
        self.ssd_dir = ssd_dir
        self.keys = keys or (12 if dry else 256)
        # A key: LAYERS pages of PAGE bytes (about a hybrid model's attention block).
        self.layers, self.page = (3, 4096) if dry else (16, 65536)
        self.sleep_s = 0.0 if dry else 0.3
        self._cycles: int | None = None
        self.ratios: list[tuple[str, int, float, float, str]] = []

    def stream(self):
        from histate_vllm.datapath.streams import transfer_stream

        return transfer_stream(self.device)

    def long_kernel(self):
        """Queue about `sleep_s` of work on the current stream (nothing on a CPU)."""
        if not self.gpu:
            return
        torch = self.torch
        if self._cycles is None:  # _sleep spins for clock cycles: calibrate once
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.cuda._sleep(10**7)
            e.record()
            e.synchronize()
            self._cycles = int(10**7 * self.sleep_s / (s.elapsed_time(e) / 1e3))
        torch.cuda._sleep(self._cycles)

    def sync(self):
        if self.gpu:
            self.torch.cuda.synchronize(self.device)


# --- kernels ---

def check_kernels(ctx: Ctx) -> str:
    torch = ctx.torch
    from histate_vllm.kernels import reference, triton_impl

    poison = 0xA5
    gen = torch.Generator().manual_seed(3)
    # (page elements, dtype, pad elements, ids, offset bytes, nbytes)
    cases = [
        (37 * 3, torch.int32, 0, [5, 1, 3, 8], 0, None),
        (37 * 3, torch.int32, 0, [8, 0, 2], 4, 60),
        (51, torch.uint8, 0, [6, 2, 9, 4, 1], 3, 17),
        (129, torch.int16, 0, [7, 3], 10, 226),
        (37, torch.int32, 5, [0, 9, 4], 8, 120),
        (51, torch.uint8, 1, [3, 0, 7], 4, 44),
        (8191, torch.uint8, 0, [9, 0, 5], 1, 8000),
        (16384, torch.int64, 3, [4, 2], 0, None),
    ]
    n = 0
    for page, dtype, pad, ids, offset, nbytes in cases:
        base = torch.randint(-(2**31), 2**31 - 1, (10, page + pad), generator=gen).to(dtype)
        cache = base.to(ctx.device)[:, :page]  # sliced on the device: the stride stays
        want = reference.gather_pages(cache.cpu(), ids, offset, nbytes)
        out = torch.full(tuple(want.shape), poison, dtype=torch.uint8, device=ctx.device)
        triton_impl.gather_pages(cache, ids, offset, nbytes, out=out)
        assert torch.equal(out.cpu(), want), f"gather {page}x{dtype} off {offset}"
        dst = torch.full((10, page + pad), 0, dtype=dtype, device=ctx.device)
        dst.view(torch.uint8).fill_(poison)
        ref = dst.cpu().clone()
        triton_impl.scatter_pages(dst[:, :page], ids, want.to(ctx.device), offset, nbytes)
        reference.scatter_pages(ref[:, :page], ids, want, offset, nbytes)
        assert torch.equal(dst.cpu(), ref), f"scatter {page}x{dtype} off {offset}"
        if offset % 4 == 0 and (nbytes or page * cache.element_size()) % 4 == 0 and \
                (page + pad) * cache.element_size() % 4 == 0:
            got = triton_impl.checksum_pages(cache, ids, offset, nbytes)
            assert torch.equal(got.cpu(), reference.checksum_pages(cache.cpu(), ids, offset,
                                                                   nbytes)), "checksum"
        n += 1
    big = _check_past_2_31(ctx)
    _time_kernels(ctx)
    return f"{n} cases gather/scatter/checksum = torch reference; {big}"


def _check_past_2_31(ctx: Ctx) -> str:
    """Pages whose element offset is past 2**31: byte-wide words (odd page), 2.1 GB."""
    if not ctx.gpu:
        return "pages past 2**31 elements: SKIP (dry run)"
    torch = ctx.torch
    from histate_vllm.kernels import reference, triton_impl

    page = 65537  # odd: the kernels move it as bytes, element offset == byte offset
    blocks = (2**31 + 4 * page) // page
    cache = torch.empty(blocks, page, dtype=torch.uint8, device=ctx.device)
    ids = [blocks - 1, 3, blocks - 2]
    assert (blocks - 2) * page > 2**31
    payload = torch.randint(0, 256, (3, page), dtype=torch.uint8, device=ctx.device)
    triton_impl.scatter_pages(cache, ids, payload)
    out = torch.full_like(payload, 0xA5)
    triton_impl.gather_pages(cache, ids, out=out)
    assert torch.equal(out, payload), "gather past 2**31"
    assert torch.equal(cache[blocks - 1], payload[0]) and torch.equal(cache[3], payload[1])
    del cache
    # The checksum reads 32-bit words: past 2**31 of them is an 8.6 GB cache.
    words = 16384
    if torch.cuda.get_device_properties(ctx.device).total_memory < 24 << 30:
        return "gather/scatter past 2**31 elements match (checksum: GPU too small)"
    blocks = 2**31 // words + 2
    cache = torch.empty(blocks, 4 * words, dtype=torch.uint8, device=ctx.device)
    ids = [blocks - 1, 5]
    cache[ids] = torch.randint(0, 256, (2, 4 * words), dtype=torch.uint8, device=ctx.device)
    got = triton_impl.checksum_pages(cache, ids)
    want = reference.checksum_pages(cache[ids].cpu(), [0, 1])
    assert torch.equal(got.cpu(), want), "checksum past 2**31 words"
    del cache
    torch.cuda.empty_cache()
    return "gather/scatter/checksum past 2**31 elements match"


def _time_kernels(ctx: Ctx) -> None:
    torch = ctx.torch
    from histate_vllm.kernels import reference, triton_impl

    blocks, page, count = (64, 4096, 16) if ctx.dry else (8192, 65536, 1024)
    cache = torch.randint(0, 255, (blocks, page), dtype=torch.uint8, device=ctx.device)
    ids = torch.randperm(blocks)[:count].tolist()
    out = torch.empty(count, page, dtype=torch.uint8, device=ctx.device)
    for name, tri, ref in (
        ("gather (Triton / torch index ops)",
         lambda: triton_impl.gather_pages(cache, ids, out=out),
         lambda: reference.gather_pages(cache, ids, out=out)),
        ("scatter (Triton / torch index ops)",
         lambda: triton_impl.scatter_pages(cache, ids, out),
         lambda: reference.scatter_pages(cache, ids, out)),
        ("checksum (Triton / torch)",
         lambda: triton_impl.checksum_pages(cache, ids),
         lambda: reference.checksum_pages(cache, ids)),
    ):
        t_tri, t_ref = _timed(ctx, tri), _timed(ctx, ref)
        ctx.ratios.append((name, count * page, count * page / t_tri, count * page / t_ref,
                           "device"))


def _timed(ctx: Ctx, fn, iters: int | None = None) -> float:
    """Median seconds of `fn` (CUDA events on a GPU, the clock on a CPU)."""
    torch = ctx.torch
    iters = iters or (2 if ctx.dry else 10)
    fn()
    times = []
    for _ in range(iters):
        if ctx.gpu:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


# --- ordering against compute ---

def _layout(ctx: Ctx, aliased: bool, two_groups: bool = False):
    """Caches and groups: one group of `layers` tensors, or an attention group and a state
    group, each on its own blocks, pages of different sizes, block stride larger than
    either page: sharing every tensor (`aliased`, as vLLM allocates hybrid models), or
    each layer of each group in a tensor of its own (`two_groups`)."""
    torch = ctx.torch
    blocks, page = 4 * ctx.keys, ctx.page
    stride = page + page // 2 + 256  # larger than either group's page

    def tensors():
        return [torch.zeros(blocks, stride, dtype=torch.int8, device=ctx.device)
                for _ in range(ctx.layers)]

    base = tensors()
    attn = [(t[:, :page], page, i * page) for i, t in enumerate(base)]
    if not (aliased or two_groups):
        return base, [attn], [list(range(0, 2 * ctx.keys, 2))]
    state_base = base if aliased else tensors()
    state_page = page // 2 + 128
    state = [(t[:, :state_page], state_page, i * state_page) for i, t in enumerate(state_base)]
    half = ctx.keys // 2
    return (base if aliased else base + state_base), [attn, state], [
        list(range(1, 2 * half, 2)), list(range(2 * half + 1, 2 * half + 1 + 2 * half, 2))]


def _host_rows(ctx: Ctx, groups, count: int):
    from histate_vllm.datapath.hostmem import HostRows

    key_bytes = max(sum(n for _, n, _ in g) for g in groups)
    return HostRows(count, key_bytes, pin=ctx.gpu)


def _check_store_load(ctx: Ctx, aliased: bool, two_groups: bool = False,
                      pointers: bool = False) -> str:
    """Store then load through the copier; `pointers`: each job's blocks come from the
    page addresses vLLM 0.34 hands a worker (`device_pointers`), read back as the worker
    does (`datapath.pages.blocks_from_pointers`)."""
    torch = ctx.torch
    from histate_vllm.datapath.copier import PageCopier

    base, groups, group_blocks = _layout(ctx, aliased, two_groups)
    # No vLLM: the kernels path, staged as on a device (forced in a dry run, to run it).
    copier = PageCopier(groups, staged=True)
    rows = _host_rows(ctx, groups, 2 * ctx.keys)
    gen = torch.Generator().manual_seed(11)
    # Keys go to scattered, out-of-order rows.
    order = torch.randperm(2 * ctx.keys, generator=gen).tolist()
    if pointers:
        group_blocks = _blocks_via_pointers(groups, group_blocks)
    parts, at = [], 0
    for g, blocks in enumerate(group_blocks):
        parts.append((g, blocks, order[at:at + len(blocks)]))
        at += len(blocks)
    store_s, load_s = ctx.stream(), ctx.stream()
    compute = torch.cuda.Stream(ctx.device) if ctx.gpu else None
    stream_ctx = (lambda: torch.cuda.stream(compute)) if ctx.gpu else _null
    # Store: compute writes the pages after a long kernel; the copy must see them.
    on_device = [torch.randint(-128, 127, tuple(t.shape), dtype=torch.int8, device=ctx.device)
                 for t in base]
    pattern = [p.cpu() for p in on_device]
    # Once to compile the kernels (a first launch's JIT would look like a wait), once timed.
    for _ in range(2):
        submit_store, submit_load = _store_then_load(ctx, copier, base, groups, parts, rows,
                                                     pattern, on_device, stream_ctx,
                                                     store_s, load_s)
    rows.close()
    if not ctx.gpu:
        return "bytes in place (CPU stream: ordering and non-blocking submit need a GPU)"
    limit = ctx.sleep_s / 10
    assert submit_store < limit and submit_load < limit, (
        f"submit waited: store {submit_store * 1e3:.1f} ms, load {submit_load * 1e3:.1f} ms "
        f"behind a {ctx.sleep_s * 1e3:.0f} ms compute kernel")
    return (f"bytes in place after a {ctx.sleep_s * 1e3:.0f} ms compute kernel; submit "
            f"returned in {submit_store * 1e3:.2f} / {submit_load * 1e3:.2f} ms")


def _store_then_load(ctx, copier, base, groups, parts, rows, pattern, on_device, stream_ctx,
                     store_s, load_s):
    torch = ctx.torch
    for t in base:
        t.fill_(0)
    rows.tensor.fill_(0)
    ctx.sync()
    with stream_ctx():
        ctx.long_kernel()
        for t, p in zip(base, on_device):
            t.copy_(p)
        t0 = time.perf_counter()
        event = store_s.launch(copier.batch(parts, rows.tensor, to_host=True,
                                            breaks=rows.breaks), after=store_s.mark_compute())
        submit_store = time.perf_counter() - t0
    event.synchronize()
    for g, blocks, host in parts:
        for tensor, nbytes, offset in groups[g]:
            i = [t.data_ptr() for t in base].index(tensor.data_ptr())
            want = pattern[i][blocks, :nbytes]
            got = rows.tensor[host, offset:offset + nbytes]
            assert torch.equal(got, want), f"store group {g}: host rows miss compute's writes"
    # Load: compute zeroes the blocks after a long kernel; the load must land after it.
    for t in base:
        t.fill_(0)
    ctx.sync()
    with stream_ctx():
        ctx.long_kernel()
        for t in base:
            t.fill_(0)  # vLLM zeroes blocks it allocates for a load (a state's column)
        t0 = time.perf_counter()
        event = load_s.launch(copier.batch(parts, rows.tensor, to_host=False,
                                           breaks=rows.breaks), after=load_s.mark_compute())
        submit_load = time.perf_counter() - t0
    event.synchronize()
    ctx.sync()
    for g, blocks, host in parts:
        for tensor, nbytes, offset in groups[g]:
            i = [t.data_ptr() for t in base].index(tensor.data_ptr())
            got = base[i][blocks, :nbytes].cpu()
            assert torch.equal(got, pattern[i][blocks, :nbytes]), \
                f"load group {g}: blocks do not hold the loaded bytes (overtaken?)"
    return submit_store, submit_load


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_store_load(ctx: Ctx) -> str:
    return _check_store_load(ctx, aliased=False)


def check_aliased_groups(ctx: Ctx) -> str:
    return _check_store_load(ctx, aliased=True)


# --- vLLM 0.34's copy contract ---

def device_pointers(groups, group_blocks):
    """A job's GPU side as vLLM 0.34 hands it to a worker (`DevicePointers`, which its
    `resolve_device_pointers` builds): for each group, each layer, each block, the page's
    address and size. Returns (ptrs, sizes, blocks per group, layers per group)."""
    import numpy as np

    ptrs, sizes = [], []
    for views, blocks in zip(groups, group_blocks):
        for tensor, nbytes, _ in views:
            ptrs += [tensor.data_ptr() + b * tensor.stride(0) for b in blocks]
            sizes += [nbytes] * len(blocks)
    return (np.array(ptrs, dtype=np.uint64), np.array(sizes, dtype=np.uint64),
            tuple(len(b) for b in group_blocks), tuple(len(v) for v in groups))


def _blocks_via_pointers(groups, group_blocks):
    """Each group's blocks read back from the job's page addresses, as the worker does;
    an address off by one byte must be refused, never copied."""
    from histate_vllm.datapath.pages import LayoutError, blocks_from_pointers

    ptrs, sizes, counts, refs = device_pointers(groups, group_blocks)
    got_counts, ids = blocks_from_pointers(groups, ptrs, sizes, counts, refs)
    assert list(got_counts) == list(counts) and ids == [b for bl in group_blocks for b in bl]
    bad = ptrs.copy()
    bad[-1] += 1
    try:
        blocks_from_pointers(groups, bad, sizes, counts, refs)
    except LayoutError:
        pass
    else:
        raise AssertionError("a page address off by one byte was accepted")
    out, at = [], 0
    for n in got_counts:
        out.append(ids[at:at + n])
        at += n
    return out


def check_pointers_per_layer(ctx: Ctx) -> str:
    return _check_store_load(ctx, aliased=False, two_groups=True, pointers=True)


def check_pointers_aliased(ctx: Ctx) -> str:
    return _check_store_load(ctx, aliased=True, pointers=True)


# --- bandwidth ---

def check_bandwidth(ctx: Ctx) -> str:
    torch = ctx.torch
    from histate_vllm.datapath.copier import PageCopier

    _, groups, group_blocks = _layout(ctx, aliased=False)
    copier = PageCopier(groups, staged=True)
    rows = _host_rows(ctx, groups, ctx.keys)
    gen = torch.Generator().manual_seed(5)
    host = torch.randperm(ctx.keys, generator=gen).tolist()
    parts = [(0, group_blocks[0], host)]
    nbytes = copier.batch(parts, rows.tensor, to_host=True).nbytes
    stream = ctx.stream()

    def through(to_host):
        def run():
            event = stream.launch(copier.batch(parts, rows.tensor, to_host=to_host,
                                               breaks=rows.breaks))
            event.synchronize()
            return event.seconds()
        return run

    dev = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=ctx.gpu)
    for name, to_host, plain in (
        ("GPU -> DRAM (copier / pinned memcpy)", True,
         lambda: pinned.copy_(dev, non_blocking=True)),
        ("DRAM -> GPU (copier / pinned memcpy)", False,
         lambda: dev.copy_(pinned, non_blocking=True)),
    ):
        run = through(to_host)
        run()
        ours = sorted(run() for _ in range(3 if ctx.dry else 10))[1 if ctx.dry else 5]
        ctx.ratios.append((name, nbytes, nbytes / ours, nbytes / _timed(ctx, plain), ""))
    rows.close()
    return f"{ctx.keys} keys of {ctx.layers} x {ctx.page} bytes each way"


def check_ssd(ctx: Ctx) -> str:
    torch = ctx.torch
    try:
        import msgspec  # noqa: F401  (the store's file format)
    except ImportError:
        raise Skip("the SSD store needs msgspec (pip install msgspec, or carry its wheel)")
    from concurrent.futures import ThreadPoolExecutor

    from histate_vllm.datapath.copier import PageCopier
    from histate_vllm.datapath.ssd_load import SSDLoad, restore
    from histate_vllm.store import SSDStore, StoreIdentity

    _, groups, group_blocks = _layout(ctx, aliased=False)
    key_bytes = sum(n for _, n, _ in groups[0])
    copier = PageCopier(groups, staged=True)
    ident = StoreIdentity(model="gpu-check", dtype="int8", kv_layout="LBHNC", block_size=16,
                          tp_rank=0, tp_size=1, page_bytes=key_bytes, vllm_version="none")
    with tempfile.TemporaryDirectory(dir=ctx.ssd_dir, prefix="histate-gpu-check-") as root:
        store = SSDStore(root, ident, budget_bytes=4 * ctx.keys * (key_bytes + 65536))
        dram = _host_rows(ctx, groups, 1)
        staging = _host_rows(ctx, groups, 8)
        keys, payloads = [], []
        gen = torch.Generator().manual_seed(9)
        for i in range(ctx.keys):
            key = i.to_bytes(32, "big") + (0).to_bytes(4, "big")
            payload = dram.array[0]
            payload[:] = torch.randint(-128, 127, (payload.shape[0],), dtype=torch.int8,
                                       generator=gen).numpy()
            store.write_chunk(key, payload, provenance="gpu-check")
            keys.append(key)
            payloads.append(payload[:key_bytes].copy())
        files = [str(p) for p in Path(root).rglob("*") if p.is_file()
                 and p.stat().st_size >= key_bytes]
        _drop_cache(files)
        stream = ctx.stream()
        job = SSDLoad()
        blocks = group_blocks[0]
        parts = [(0, blocks, list(range(ctx.keys)))]
        io = ThreadPoolExecutor(4, thread_name_prefix="gpu-check-read")
        t0 = time.perf_counter()
        moved = restore(copier, stream, store, dram, staging, io, 4, keys,
                        [False] * ctx.keys, [-1] * ctx.keys, parts, None, job)
        job.last.synchronize()
        ours = time.perf_counter() - t0
        io.shutdown()
        for i, b in enumerate(blocks):
            got = b"".join(bytes(t[b, :n].cpu().numpy()) for t, n, _ in groups[0])
            assert got == payloads[i].tobytes(), f"SSD key {i} restored wrong"
        _drop_cache(files)
        raw = _raw_read(files)
        ctx.ratios.append(("SSD -> GPU (store pipeline / raw O_DIRECT read)", moved,
                           moved / ours, sum(os.path.getsize(f) for f in files) / raw,
                           "disk"))
        dram.close()
        staging.close()
    return f"{ctx.keys} files restored and verified"


def _drop_cache(files) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _raw_read(files) -> float:
    """Seconds to read every file once, 4 in parallel, O_DIRECT where the file system
    allows it (as the store's reads), into page-aligned buffers."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    def read(path):
        size = os.path.getsize(path)
        buf = mmap.mmap(-1, -(-size // 4096) * 4096)
        flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
        try:
            fd = os.open(path, flags)
        except OSError:
            fd = os.open(path, os.O_RDONLY)
        try:
            view, done = memoryview(buf), 0
            while done < size:
                n = os.readv(fd, [view[done:]])
                if n <= 0:
                    break
                done += n
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(read, files))
    return time.perf_counter() - t0


CHECKS = [
    ("kernels", check_kernels),
    ("store/load ordering", check_store_load),
    ("two groups aliasing one tensor", check_aliased_groups),
    ("vLLM 0.34 DevicePointers, a tensor per layer", check_pointers_per_layer),
    ("vLLM 0.34 DevicePointers, aliased groups", check_pointers_aliased),
    ("bandwidth DRAM<->GPU", check_bandwidth),
    ("bandwidth SSD->GPU", check_ssd),
]


def main(argv=None) -> int:
    args = _args(argv)
    gpu = _gpu_present()
    dry = args.dry_run or not gpu
    if dry and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # the kernels run on CPU tensors
    import torch
    import triton

    ctx = Ctx(dry, args.ssd_dir, args.keys)
    name = torch.cuda.get_device_name(ctx.device) if ctx.gpu else "CPU"
    print(f"gpu_check: {name}; torch {torch.__version__}, triton {triton.__version__}, "
          f"python {sys.version.split()[0]}; {'dry run (small sizes)' if dry else 'full'}")
    failed = 0
    t_all = time.perf_counter()
    for label, fn in CHECKS:
        t = time.perf_counter()
        try:
            detail = fn(ctx)
            status = "PASS"
        except Skip as e:
            status, detail = "SKIP", str(e)
        except Exception as e:  # every check reports; one failure does not hide the rest
            status, detail = "FAIL", f"{type(e).__name__}: {e}"
            failed += 1
            traceback.print_exc(file=sys.stderr)
        print(f"{status}  {label}: {detail} ({time.perf_counter() - t:.1f} s)", flush=True)
    print()
    print("| what | bytes | this GB/s | baseline GB/s | ratio |")
    print("|---|---|---|---|---|")
    for what, nbytes, ours, base, _ in ctx.ratios:
        print(f"| {what} | {nbytes:,} | {ours / 1e9:.2f} | {base / 1e9:.2f} | "
              f"{ours / base:.2f} |")
    if dry:
        print("(dry run: CPU or small sizes; the ratios say nothing about a GPU)")
    print(f"\n{'FAIL' if failed else 'PASS'}: {failed} of {len(CHECKS)} checks failed "
          f"in {time.perf_counter() - t_all:.0f} s")
    return 1 if failed else 0


def _gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
