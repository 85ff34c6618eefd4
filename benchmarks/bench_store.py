"""Benchmark the SSD store against the raw sequential bandwidth of the same disk.

Writes and restores the KV chunk files of one long context plus a few recurrent-state
checkpoints (64 MiB each, as for Qwen3-Next), through the store (checksums, fsync of
files and directories, manifests) and through its background writer (`--io-threads`
chunk writes at once), restores with `--read-ahead` verified reads in flight into a ring
of page-aligned buffers (O_DIRECT, as the worker's pinned staging rows), and prints the
throughput next to raw sequential bandwidth measured in the same run, on the same
file system: O_DIRECT writes and reads, fsync'd buffered writes (like `dd conv=fsync`)
and cold buffered reads; the faster of each pair is the reference for the ratio. The
disk is shared and noisy, so the whole sequence runs in rounds and medians are shown.

Restores read from disk, not the page cache: every file is fsynced and then dropped
from the cache (posix_fadvise DONTNEED) before it is read back.

    python benchmarks/bench_store.py [--dir DIR] [--context-tokens 32768] [--rounds 3] \\
        [--summary OUT.json]
    python benchmarks/bench_store.py --report OUT.json [OUT2.json ...] [--into RESULTS_MD]

--summary saves the run's measurements; --report prints one table row per saved run
(--into writes the table into the results file's 'store' block). Results and how they
were measured: benchmarks/results_store.md.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from results_blocks import cpu_name, show_or_write  # noqa: E402

from histate_vllm.store import (  # noqa: E402
    Read,
    SSDStore,
    StoreIdentity,
    StoreWriter,
    aligned_buffer,
)

MiB = 1 << 20
PIECE = 8 * MiB


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_tree(top: str) -> None:
    for d, _, files in os.walk(top):
        for f in files:
            drop_cache(os.path.join(d, f))


def raw_direct(path: str, nbytes: int) -> tuple[float, float]:
    """(write, read) bytes/s with O_DIRECT, sequential, 8 MiB requests."""
    buf = mmap.mmap(-1, PIECE)  # page-aligned, as O_DIRECT needs
    buf.write(np.random.default_rng(1).integers(0, 256, PIECE, dtype=np.uint8).tobytes())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    t = time.perf_counter()
    for _ in range(nbytes // PIECE):
        os.write(fd, buf)
    os.fsync(fd)
    write_s = time.perf_counter() - t
    os.close(fd)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    t = time.perf_counter()
    while os.readv(fd, [buf]) > 0:
        pass
    read_s = time.perf_counter() - t
    os.close(fd)
    os.unlink(path)
    return nbytes / write_s, nbytes / read_s


def raw_buffered_fsync(path: str, nbytes: int) -> float:
    """bytes/s of buffered sequential writes then fsync (like dd conv=fsync)."""
    data = np.random.default_rng(2).integers(0, 256, PIECE, dtype=np.uint8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t = time.perf_counter()
    for _ in range(nbytes // PIECE):
        os.write(fd, data)
    os.fsync(fd)
    s = time.perf_counter() - t
    os.close(fd)
    os.unlink(path)
    return nbytes / s


def raw_buffered_read(path: str, nbytes: int) -> float:
    """bytes/s of a cold buffered sequential read (page cache dropped first, like dd)."""
    # Random bytes: a virtual disk may store zeros without writing them.
    data = np.random.default_rng(3).integers(0, 256, PIECE, dtype=np.uint8)
    with open(path, "wb") as f:
        f.writelines(data for _ in range(nbytes // PIECE))
    drop_cache(path)
    fd = os.open(path, os.O_RDONLY)
    t = time.perf_counter()
    while os.readv(fd, [data]) > 0:
        pass
    s = time.perf_counter() - t
    os.close(fd)
    os.unlink(path)
    return nbytes / s


def measure_raw(work: str, nbytes: int) -> dict[str, float]:
    w, r = raw_direct(os.path.join(work, "raw.direct"), nbytes)
    b = raw_buffered_fsync(os.path.join(work, "raw.buffered"), nbytes)
    br = raw_buffered_read(os.path.join(work, "raw.read"), nbytes)
    return {"direct_write": w, "direct_read": r, "buffered_fsync_write": b, "buffered_read": br}


def key(name: str, group: int = 0) -> bytes:
    import hashlib

    return hashlib.sha256(name.encode()).digest() + group.to_bytes(4, "big")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where to write (the disk)")
    p.add_argument("--context-tokens", type=int, default=32768)
    p.add_argument("--chunk-tokens", type=int, default=384, help="tokens per KV chunk")
    p.add_argument("--kib-per-token", type=int, default=24, help="KV bytes per token / 1024")
    p.add_argument("--states", type=int, default=4, help="checkpoints along the context")
    p.add_argument("--state-mib", type=int, default=64)
    p.add_argument("--raw-mib", type=int, default=512, help="size of each raw measurement")
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    p.add_argument(
        "--unaligned",
        action="store_true",
        help="payloads in ordinary (not page-aligned) memory: copied to staging",
    )
    p.add_argument("--buffered", action="store_true", help="store writes without O_DIRECT")
    p.add_argument("--read-ahead", type=int, default=4, help="restore reads in flight")
    p.add_argument("--io-threads", type=int, default=4, help="StoreWriter write threads")
    p.add_argument("--summary", help="save the run's measurements here (JSON)")
    p.add_argument("--report", nargs="+", metavar="SUMMARY_JSON",
                   help="print the table of earlier runs' --summary files; run nothing")
    p.add_argument("--into", metavar="RESULTS_MD",
                   help="with --report: write it into the file's 'store' block")
    args = p.parse_args()
    if args.report:
        summaries = [json.loads(open(path).read()) for path in args.report]
        show_or_write(report(summaries), args.into and Path(args.into), "store")
        return
    work = tempfile.mkdtemp(prefix="bench_store-", dir=args.dir)
    try:
        summary = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
        print(report([summary]))
        print(f"summary: {args.summary} (python benchmarks/bench_store.py --report "
              f"{args.summary})")


class Workload:
    """One context's chunks and states, and the keys and positions of a store."""

    def __init__(self, args) -> None:
        self.args = args
        self.chunk_bytes = args.chunk_tokens * args.kib_per_token * 1024
        self.n_chunks = math.ceil(args.context_tokens / args.chunk_tokens)
        self.state_bytes = args.state_mib * MiB
        self.total = self.n_chunks * self.chunk_bytes + args.states * self.state_bytes
        self.identity = StoreIdentity(
            model="bench",
            dtype="bfloat16",
            kv_layout="NHD",
            block_size=args.chunk_tokens,
            tp_rank=0,
            tp_size=1,
            page_bytes=self.chunk_bytes,
            vllm_version="bench",
        )
        rng = np.random.default_rng(0)

        def buffer(n: int) -> np.ndarray:
            # Offloaded pages sit in pinned host memory, which is page-aligned; the
            # store writes those without a copy. --unaligned: an ordinary numpy array.
            out = np.empty(n + 1, np.uint8)[1:] if args.unaligned else aligned_buffer(n)
            out[:] = rng.integers(0, 256, n, dtype=np.uint8)
            return out

        # Distinct owned buffers per chunk would take 774 MiB: 4 are reused, which is
        # allowed because nothing modifies them while queued.
        self.chunks = [buffer(self.chunk_bytes) for _ in range(4)]
        self.states = [buffer(self.state_bytes) for _ in range(args.states)]

    def checkpoint(self, i: int) -> tuple[int, list[bytes]]:
        """State i sits at the end of its share of the context, after its chunks."""
        n = math.ceil(self.n_chunks * (i + 1) / self.args.states)
        return n * self.args.chunk_tokens, [key(f"c{j}") for j in range(n)]

    def write(self, store: SSDStore) -> tuple[float, list[float]]:
        """Offload through the StoreWriter as an engine would; (bytes/s, latencies)."""
        writer = StoreWriter(
            store, max_pending_bytes=2 * self.total, io_threads=self.args.io_threads
        )
        lat, written = [], 0
        t = time.perf_counter()
        for i, state in enumerate(self.states):
            pos, chunk_keys = self.checkpoint(i)
            for j in range(written, len(chunk_keys)):
                s = time.perf_counter()
                writer.submit_chunk(chunk_keys[j], self.chunks[j % 4], provenance="bench")
                lat.append(time.perf_counter() - s)
                time.sleep(0.001)  # the engine step between two offloads
            written = len(chunk_keys)
            s = time.perf_counter()
            writer.submit_checkpoint(
                key(f"s{i}", 1), state, position=pos, chunk_keys=chunk_keys, provenance="bench"
            )
            lat.append(time.perf_counter() - s)
        writer.flush()
        rate = self.total / (time.perf_counter() - t)
        assert all(c.ok for c in writer.drain_finished())
        writer.close()
        return rate, lat

    def restore(self, store: SSDStore) -> tuple[float, float, float]:
        """Cold restores: (bytes/s over everything, s for the deepest context, scan s).

        As the worker restores: `read_many`, `--read-ahead` files in flight, each into
        its own buffer of a ring (the deepest state and its chunks, then the others)."""
        t = time.perf_counter()
        index = store.scan()
        scan_s = time.perf_counter() - t
        drop_tree(store.layout.dir)
        ahead = self.args.read_ahead
        ring = [aligned_buffer(max(self.state_bytes, self.chunk_bytes)) for _ in range(ahead)]
        deepest = key(f"s{self.args.states - 1}", 1)
        chunk_keys = index.checkpoints[deepest].chunk_keys
        context = [(deepest, True)] + [(k, False) for k in chunk_keys]
        others = [(key(f"s{i}", 1), True) for i in range(self.args.states - 1)]
        t = time.perf_counter()
        context_s = 0.0
        for part in (context, others):
            reads = [Read(k, is_state, ring[i % ahead]) for i, (k, is_state) in enumerate(part)]
            for _ in store.read_many(reads, ahead=ahead):
                pass
            context_s = context_s or time.perf_counter() - t
        return self.total / (time.perf_counter() - t), context_s, scan_s


def run(args, work: str) -> dict:
    w = Workload(args)
    print(f"disk: {work}")
    print(
        f"context: {args.context_tokens} tokens = {w.n_chunks} chunks x "
        f"{w.chunk_bytes / MiB:.1f} MiB + {args.states} states x {args.state_mib} MiB "
        f"= {w.total / MiB:.0f} MiB per round, {args.rounds} rounds; payloads "
        f"{'unaligned' if args.unaligned else 'page-aligned'}, "
        f"{'buffered' if args.buffered else 'O_DIRECT'} writes on {args.io_threads} "
        f"threads, {args.read_ahead} reads in flight"
    )
    rows: dict[str, list[float]] = {}
    lat: list[float] = []
    for r in range(args.rounds):
        for k, v in measure_raw(work, args.raw_mib * MiB).items():
            rows.setdefault(k, []).append(v)
        store = SSDStore(
            os.path.join(work, f"store{r}"),
            w.identity,
            budget_bytes=1 << 50,
            direct_io=not args.buffered,
        )
        rate, round_lat = w.write(store)
        lat += round_lat
        rows.setdefault("store_write", []).append(rate)
        rate, context_s, scan_s = w.restore(store)
        rows.setdefault("store_read", []).append(rate)
        rows.setdefault("context_s", []).append(context_s)
        rows.setdefault("scan_s", []).append(scan_s)
        shutil.rmtree(store.root)
        print(
            f"  round {r}: raw O_DIRECT write {rows['direct_write'][-1] / MiB:.0f}, "
            f"fsync'd buffered write {rows['buffered_fsync_write'][-1] / MiB:.0f}, "
            f"O_DIRECT read {rows['direct_read'][-1] / MiB:.0f}, "
            f"buffered read {rows['buffered_read'][-1] / MiB:.0f}; store write "
            f"{rows['store_write'][-1] / MiB:.0f}, read {rows['store_read'][-1] / MiB:.0f}"
            " MiB/s"
        )
    med = {k: statistics.median(v) for k, v in rows.items()}
    # Per round too: store and raw measured minutes apart see the same disk weather.
    best_w = [max(a, b) for a, b in zip(rows["direct_write"], rows["buffered_fsync_write"])]
    best_r = [max(a, b) for a, b in zip(rows["direct_read"], rows["buffered_read"])]
    round_w = statistics.median(s / r for s, r in zip(rows["store_write"], best_w))
    round_r = statistics.median(s / r for s, r in zip(rows["store_read"], best_r))
    # The reference is the faster way of using the disk, so the ratio is not flattered.
    raw_write = max(med["direct_write"], med["buffered_fsync_write"])
    raw_read = max(med["direct_read"], med["buffered_read"])

    def row(name: str, value: float, ref: float | None = None) -> None:
        ratio = f"{value / ref:6.0%} of raw" if ref else ""
        print(f"  {name:<48} {value / MiB:8.0f} MiB/s  {ratio}")

    print(f"medians of {args.rounds} rounds:")
    row("raw: O_DIRECT sequential write (8 MiB requests)", med["direct_write"])
    row("raw: buffered write + fsync (dd conv=fsync)", med["buffered_fsync_write"])
    row("raw: O_DIRECT sequential read", med["direct_read"])
    row("raw: buffered cold sequential read", med["buffered_read"])
    row("store write (StoreWriter, checksums, fsyncs)", med["store_write"], raw_write)
    row("store restore from disk (verified reads)", med["store_read"], raw_read)
    print(f"  median of per-round ratios: write {round_w:.0%}, restore {round_r:.0%}")
    lat.sort()
    print(
        f"  restore of the {args.context_tokens}-token context (deepest state + "
        f"{w.checkpoint(args.states - 1)[1].__len__()} chunks): {med['context_s']:.2f} s"
    )
    print(
        f"  enqueue latency over {len(lat)} submits: p50 {lat[len(lat) // 2] * 1e6:.0f} us,"
        f" p99 {lat[int(len(lat) * 0.99)] * 1e6:.0f} us, max {lat[-1] * 1e6:.0f} us"
    )
    print(f"  start-up scan of this store: {med['scan_s'] * 1e3:.1f} ms")
    return dict(settings={k: v for k, v in vars(args).items()
                          if k not in ("dir", "summary", "report", "into")},
                round_mib=w.total / MiB, chunks=w.n_chunks, chunk_mib=w.chunk_bytes / MiB,
                context_chunks=len(w.checkpoint(args.states - 1)[1]), rounds=rows,
                enqueue_us=[x * 1e6 for x in lat], cpus=os.cpu_count(), cpu=cpu_name())


def _ratios(summary: dict) -> dict[str, float]:
    """Medians (MiB/s) and ratios of one saved run, as the run printed them."""
    rows = summary["rounds"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    best_w = [max(a, b) for a, b in zip(rows["direct_write"], rows["buffered_fsync_write"])]
    best_r = [max(a, b) for a, b in zip(rows["direct_read"], rows["buffered_read"])]
    raw_w = max(med["direct_write"], med["buffered_fsync_write"])
    raw_r = max(med["direct_read"], med["buffered_read"])
    lat = sorted(summary["enqueue_us"])
    return dict(
        raw_w=raw_w / MiB, store_w=med["store_write"] / MiB, w=med["store_write"] / raw_w,
        w_round=statistics.median(s / r for s, r in zip(rows["store_write"], best_w)),
        raw_r=raw_r / MiB, store_r=med["store_read"] / MiB, r=med["store_read"] / raw_r,
        r_round=statistics.median(s / r for s, r in zip(rows["store_read"], best_r)),
        context_s=med["context_s"], scan_ms=med["scan_s"] * 1e3, p50=lat[len(lat) // 2],
        p99=lat[int(len(lat) * 0.99)], max=lat[-1])


def report(summaries: list[dict]) -> str:
    """The markdown table of saved runs (--summary), one row each."""
    first = summaries[0]
    a = first["settings"]
    out = [f"One {a['context_tokens']:,}-token context a round: {first['chunks']} KV chunk "
           f"files of {first['chunk_mib']:.1f} MiB and {a['states']} checkpoints of "
           f"{a['state_mib']} MiB ({first['round_mib']:,.0f} MiB); raw references "
           f"{a['raw_mib']} MiB each; {first['cpus']} CPUs ({first['cpu']}). MiB/s, medians "
           "of the rounds; *per round*: the median of each round's own ratio.", "",
           "| store | rounds | raw write (best of O_DIRECT / fsync'd buffered) | store write "
           "| ratio | per round | raw read (best of O_DIRECT / cold buffered) "
           "| store restore | ratio | per round | the context's restore (deepest state "
           "+ its chunks) | enqueue p50 / p99 / max |",
           "|---" * 12 + "|"]
    for s in summaries:
        a, r = s["settings"], _ratios(s)
        label = (f"{a['io_threads']} writer thread{'s' * (a['io_threads'] > 1)}, "
                 f"{a['read_ahead']} read{'s' * (a['read_ahead'] > 1)} in flight"
                 + (", buffered writes" if a["buffered"] else "")
                 + (", unaligned payloads" if a["unaligned"] else ""))
        out.append(f"| {label} | {a['rounds']} | {r['raw_w']:,.0f} | {r['store_w']:,.0f} | "
                   f"{r['w']:.0%} | {r['w_round']:.0%} | {r['raw_r']:,.0f} | "
                   f"{r['store_r']:,.0f} | {r['r']:.0%} | {r['r_round']:.0%} | "
                   f"{r['context_s']:.2f} s | {r['p50']:,.0f} / {r['p99']:,.0f} / "
                   f"{r['max']:,.0f} us |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
