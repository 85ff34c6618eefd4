"""What the store identity's weights digest costs at start-up.

    python benchmarks/bench_weights_digest.py [--gib 4] [--dir /path/on/the/drive] \\
        [--summary OUT.json]
    python benchmarks/bench_weights_digest.py --report OUT.json [--into RESULTS_MD]

Writes a file of --gib GiB of random bytes (the model's weights stand-in) and measures:
  hash      xxh3-128 over bytes already in memory, one thread and all threads: the
            digest's own rate, whatever the drive;
  first     the first start: the file read from the drive (page cache dropped first
            where this process may, else said so) and hashed;
  restart   a restart over unchanged weights: the cached digest (a stat per file);
then what a first start costs for 20 GB and 200 GB of weights, from the measured hash
rate and a drive's sequential read rate (this drive's, and NVMe PCIe 4 / 5 figures):
the read and the hash overlap, so the slower of the two sets it. --summary saves the
measurements; --report prints the tables from them (--into writes them into the results
file's 'weights-digest' block). Results: benchmarks/results_weights_digest.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import xxhash  # noqa: E402

from histate_vllm.store import weights_digest  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from results_blocks import cpu_name, show_or_write  # noqa: E402

NVME = {"NVMe PCIe 4 (7 GB/s)": 7.0, "NVMe PCIe 5 (12 GB/s)": 12.0}


def hash_rate(threads: int) -> float:
    buf = os.urandom(256 << 20)

    def one(_):
        h = xxhash.xxh3_128()
        for _ in range(4):
            h.update(buf)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))
    return threads * 4 * len(buf) / (time.perf_counter() - t0) / 1e9


def drop_page_cache(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--dir", default=None, help="where the test file goes (a temp dir)")
    ap.add_argument("--summary", type=Path, help="save the measurements here (JSON)")
    ap.add_argument("--report", type=Path, metavar="SUMMARY_JSON",
                    help="print the tables of an earlier run's --summary file; run nothing")
    ap.add_argument("--into", type=Path, metavar="RESULTS_MD",
                    help="with --report: write them into the file's 'weights-digest' block")
    args = ap.parse_args(argv)
    if args.report:
        show_or_write(report(json.loads(args.report.read_text())), args.into,
                      "weights-digest")
        return 0
    threads = min(os.cpu_count() or 1, weights_digest._THREADS)
    one, many = hash_rate(1), hash_rate(threads)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        f = Path(d) / "model.safetensors"
        chunk = os.urandom(64 << 20)
        with open(f, "wb") as out:
            for _ in range(int(args.gib * 16)):
                out.write(chunk)
        size = f.stat().st_size
        cold = drop_page_cache(f)
        weights_digest.RACY_S = 0.0  # the file was just written: cache it anyway
        _, first = weights_digest.files_digest([f], d)
        _, again = weights_digest.files_digest([f], d)
    summary = dict(bytes=size, cold=cold, threads=threads, files_at_once=weights_digest._THREADS,
                   hash_gbps_1=one, hash_gbps_n=many, first_s=first.seconds,
                   restart_s=again.seconds, restart_bytes=again.bytes_hashed,
                   cpus=os.cpu_count(), cpu=cpu_name())
    if args.summary:
        args.summary.write_text(json.dumps(summary, indent=1))
    print(report(summary))
    return 0


def report(summary: dict) -> str:
    """The markdown of one run, from its --summary file."""
    s = summary
    size, one = s["bytes"], s["hash_gbps_1"]
    read_rate = size / s["first_s"] / 1e9
    out = [f"A {size / 2**30:.1f} GiB file of random bytes, {s['cpus']} CPUs ({s['cpu']}); "
           "page cache " + ("dropped before the first start." if s["cold"] else
                            "NOT dropped (no permission): the first start read memory."), "",
           "| what | rate or time |", "|---|---|",
           f"| xxh3-128 in memory, 1 thread | {one:.1f} GB/s |",
           f"| xxh3-128 in memory, {s['threads']} threads | {s['hash_gbps_n']:.1f} GB/s |",
           f"| first start: read and hash ({size / 1e9:.1f} GB) | {s['first_s']:.2f} s "
           f"({read_rate:.2f} GB/s) |",
           f"| restart, weights unchanged (cached digest) | {s['restart_s'] * 1e3:.2f} ms "
           f"({s['restart_bytes']} bytes read) |", "",
           "A first start, computed: the slower of the drive's read and the hash "
           f"({one:.1f} GB/s per file being read, {s['files_at_once']} files at a time).", "",
           "| drive | 20 GB | 200 GB |", "|---|---|---|"]
    for name, rate in {f"this drive ({read_rate:.2f} GB/s)": read_rate, **NVME}.items():
        eff = min(rate, one * s["files_at_once"])
        out.append(f"| {name} | {20 / eff:.1f} s | {200 / eff:.1f} s |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
