"""What the store identity's weights digest costs at start-up.

    python benchmarks/bench_weights_digest.py [--gib 4] [--dir /path/on/the/drive]

Writes a file of --gib GiB of random bytes (the model's weights stand-in) and measures:
  hash      xxh3-128 over bytes already in memory, one thread and all threads: the
            digest's own rate, whatever the drive;
  first     the first start: the file read from the drive (page cache dropped first
            where this process may, else said so) and hashed;
  restart   a restart over unchanged weights: the cached digest (a stat per file);
then what a first start costs for 20 GB and 200 GB of weights, from the measured hash
rate and a drive's sequential read rate (this drive's, and NVMe PCIe 4 / 5 figures):
the read and the hash overlap, so the slower of the two sets it.
"""

from __future__ import annotations

import argparse
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
    args = ap.parse_args(argv)
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
    read_rate = size / first.seconds / 1e9
    print(f"{size / 2**30:.1f} GiB file, {os.cpu_count()} CPUs; page cache "
          f"{'dropped' if cold else 'NOT dropped (no permission): read from memory'}")
    print()
    print("| what | rate or time |")
    print("|---|---|")
    print(f"| xxh3-128 in memory, 1 thread | {one:.1f} GB/s |")
    print(f"| xxh3-128 in memory, {threads} threads | {many:.1f} GB/s |")
    print(f"| first start: read and hash ({size / 1e9:.1f} GB) | {first.seconds:.2f} s "
          f"({read_rate:.2f} GB/s) |")
    print(f"| restart, weights unchanged (cached digest) | {again.seconds * 1e3:.2f} ms "
          f"({again.bytes_hashed} bytes read) |")
    print()
    print("First start, computed: the slower of the drive's read and the hash "
          f"({one:.1f} GB/s per file being read, files read {weights_digest._THREADS} at "
          "a time):")
    print()
    print("| drive | 20 GB | 200 GB |")
    print("|---|---|---|")
    for name, rate in {f"this drive ({read_rate:.2f} GB/s)": read_rate, **NVME}.items():
        eff = min(rate, one * weights_digest._THREADS)
        print(f"| {name} | {20 / eff:.1f} s | {200 / eff:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
