"""The DRAM-size table of benchmarks/results_trace_replay.md from dram_sensitivity.sh's reports.

    python benchmarks/summarize_dram.py OUT_DIR                      # print one folder's
    python benchmarks/summarize_dram.py --into benchmarks/results_trace_replay.md \\
        weka=OUT_weka weka-more=OUT_weka-more                       # the `dram` block

OUT_DIR holds dram-GGG-sS.json (DRAM GiB, admission order) from
benchmarks/dram_sensitivity.sh: the raw replay at each DRAM size, every order pooled.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_blocks import write_into  # noqa: E402  (beside this script)

# histate-oracle: HiState that drops what no later request uses (knows the future).
POLICIES = ("histate", "fixed-32", "vllm034-lru-r64", "unlimited-host", "histate-oracle")


def runs(d: Path) -> dict[int, list[dict]]:
    """DRAM GiB -> the reports of every order at that size."""
    out: dict[int, list[dict]] = {}
    for p in sorted(d.glob("dram-*-s*.json")):
        gib = int(re.match(r"dram-(\d+)-s\d+$", p.stem).group(1))
        out.setdefault(gib, []).append(json.loads(p.read_text()))
    if not out:
        raise SystemExit(f"{d}: no dram-GGG-sS.json reports")
    return dict(sorted(out.items()))


def pooled(reps: list[dict], policy: str, key: str = "ttft") -> np.ndarray:
    return np.concatenate([np.asarray(r["per_request"][key][policy], dtype=float)
                           for r in reps])


def appends(reps: list[dict], policy: str) -> float:
    """Mean TTFT of the requests that extend their session's previous prompt."""
    t = pooled(reps, policy)
    cls = np.concatenate([np.asarray(r["per_request"]["class"], dtype=object) for r in reps])
    return float(t[cls == "append"].mean())


def table(d: Path) -> str:
    rows = ["| DRAM GiB | orders | HiState mean s (vs Unlimited) | fixed-32 | native r64 | "
            "Unlimited-host | HiState knowing what is dead (oracle) | HiState appends s / "
            "Unlimited-host's | HiState SSD GB read per run | HiState recovery (oracle's) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for gib, reps in runs(d).items():
        unl = pooled(reps, "unlimited").mean()
        cells = []
        for p in POLICIES:
            m = pooled(reps, p).mean()
            cells.append(f"{m:.4f} ({(m / unl - 1) * 100:+.1f}%)")
        read = np.mean([r["histate"]["restored_ssd_gb"] for r in reps])  # the main tables' column
        rec = np.mean([r["histate"]["recovery"] for r in reps])
        orec = np.mean([r["histate-oracle"]["recovery"] for r in reps])
        rows.append(f"| {gib} | {len(reps)} | {' | '.join(cells)} | "
                    f"{appends(reps, 'histate'):.3f} / {appends(reps, 'unlimited-host'):.3f} | "
                    f"{read:.0f} | {rec:.1%} ({orec:.1%}) |")
    return "\n".join(rows)


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--into":
        dirs = dict(a.split("=", 1) for a in args[2:])
        body = "\n\n".join(f"`{name}/`, raw replay:\n\n{table(Path(d))}"
                           for name, d in dirs.items())
        write_into(Path(args[1]), {"dram": body})
        return
    print(table(Path(args[0])))


if __name__ == "__main__":
    main()
