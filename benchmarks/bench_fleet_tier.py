"""Publish and restore throughput of the fleet tier on a shared directory (DirBackend).

One engine publishes checkpoints (`--chunks` KV chunks of `--chunk-mib` MiB each, then one
state of `--state-mib` MiB and the manifest, through `FleetTier.publish_checkpoint`: every
object checksummed, written under a temporary name, fsynced and linked into place); another
`FleetTier` on the same directory (another engine) restores each one whole
(`restore_checkpoint`: manifest, state and every chunk read and checked). Restores read
from disk: every object is dropped from the page cache (posix_fadvise DONTNEED) first.
Per size: GB/s of payload and seconds per checkpoint, the median of `--rounds`, each round
on new keys (nothing is deduplicated). A one-chunk checkpoint of 4 KiB objects gives the
fixed cost per checkpoint (the latency the simulator adds to a fleet restore).

    python benchmarks/bench_fleet_tier.py [--dir DIR] [--rounds 3] [--json OUT.json]

The simulator's fleet-tier defaults (trace_replay/sim/fleet.py) are this benchmark's
figures on the machine of benchmarks/results_fleet.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from histate_vllm.store.fleet import DirBackend, FleetTier
from histate_vllm.store.format import StoreIdentity

MiB = 1 << 20


def identity(page_bytes: int) -> StoreIdentity:
    return StoreIdentity(model="bench", dtype="bfloat16", kv_layout="NHD", block_size=576,
                         tp_rank=0, tp_size=1, page_bytes=page_bytes, vllm_version="0.34.0",
                         weights="bench")


def drop_cache(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def one_size(root: Path, chunks: int, chunk_bytes: int, state_bytes: int, rounds: int,
             seed: int) -> dict:
    rng = np.random.default_rng(seed)
    ident = identity(chunk_bytes)
    budget = 1 << 50  # no eviction during the measurement
    writer = FleetTier(DirBackend(root, budget), ident)
    reader = FleetTier(DirBackend(root, budget), ident)
    pub, res = [], []
    payload = chunks * chunk_bytes + state_bytes
    for r in range(rounds):
        tag = rng.integers(0, 2**62).item().to_bytes(8, "big")
        ck = [(tag + i.to_bytes(4, "big"), rng.integers(0, 256, chunk_bytes, dtype=np.uint8))
              for i in range(chunks)]
        state = rng.integers(0, 256, state_bytes, dtype=np.uint8)
        key = tag + b"\xff\xff\xff\xff"
        t = time.perf_counter()
        assert writer.publish_checkpoint(key, chunks * 576, state, ck, provenance="bench")
        pub.append(time.perf_counter() - t)
        drop_cache(root)
        t = time.perf_counter()
        got = reader.restore_checkpoint(key)
        res.append(time.perf_counter() - t)
        assert got.nbytes == payload and len(got.chunks) == chunks
    p, q = statistics.median(pub), statistics.median(res)
    return {"chunks": chunks, "chunk_bytes": chunk_bytes, "state_bytes": state_bytes,
            "payload_bytes": payload, "rounds": rounds,
            "publish_s": p, "restore_s": q,
            "publish_gbps": payload / p / 1e9, "restore_gbps": payload / q / 1e9}


SIZES = [(1, 4096, 4096), (64, 1 * MiB, 4 * MiB), (64, 2 * MiB, 4 * MiB),
         (64, 4 * MiB, 8 * MiB)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="parent of the fleet directory (default: a "
                    "temporary directory, removed after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the measurements here")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="bench-fleet-") as tmp:
        for i, (n, cb, sb) in enumerate(SIZES):
            rows.append(one_size(Path(tmp) / f"fleet{i}", n, cb, sb, a.rounds, i))
    print(f"FleetTier on DirBackend, {a.dir or tempfile.gettempdir()} "
          f"({platform.machine()}, {os.cpu_count()} CPUs); median of {a.rounds} rounds; "
          "restores from disk (page cache dropped)\n")
    print("| checkpoint | payload (MB) | publish (s) | publish (GB/s) | restore (s) | "
          "restore (GB/s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        what = (f"{r['chunks']} x {r['chunk_bytes'] / MiB:g} MiB + {r['state_bytes'] / MiB:g} "
                "MiB state" if r["chunk_bytes"] >= MiB else
                f"{r['chunks']} x {r['chunk_bytes']} B + {r['state_bytes']} B state")
        print(f"| {what} | {r['payload_bytes'] / 1e6:.1f} | {r['publish_s']:.4f} | "
              f"{r['publish_gbps']:.3f} | {r['restore_s']:.4f} | {r['restore_gbps']:.3f} |")
    big = [r for r in rows if r["chunk_bytes"] >= MiB]
    summary = {
        "backend": "DirBackend", "dir": str(a.dir or tempfile.gettempdir()), "rows": rows,
        # What the simulator takes: the fixed cost of a checkpoint, and the payload rate of
        # the realistic sizes (median over them).
        "latency_s": {"publish": rows[0]["publish_s"], "restore": rows[0]["restore_s"]},
        "gbps": {"publish": statistics.median(r["publish_gbps"] for r in big),
                 "restore": statistics.median(r["restore_gbps"] for r in big)},
    }
    print(f"\nper-checkpoint latency: publish {summary['latency_s']['publish'] * 1e3:.2f} ms, "
          f"restore {summary['latency_s']['restore'] * 1e3:.2f} ms; throughput (median of "
          f"the 64-chunk sizes): publish {summary['gbps']['publish']:.2f} GB/s, restore "
          f"{summary['gbps']['restore']:.2f} GB/s")
    if a.json:
        a.json.write_text(json.dumps(summary, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
