"""HiState with checkpoints on credit beside the default policy, per workload and order.

    python benchmarks/summarize_credit.py CREDIT_DIR weka=RUNS_weka weka-more=RUNS_weka-more

CREDIT_DIR: credit_trial.sh's runs (HiState alone, option `credit`); RUNS_*: the
trace_replay_all.sh runs of the same orders (every policy, the default HiState among them;
the synthetic workloads and Mooncake's trace are in the first folder's). Per workload, pooled
over its orders: HiState, HiState on credit, vLLM 0.34's native best (the setting of lowest
pooled mean) and Unlimited-host; then how many orders credit is at or below the others on
mean, p95 and p99. Other shapes of the TraceLab-like mix: credit_trial.sh runs both
policies (base-shape*: HiState, vLLM 0.34 at 4- and 8-block retention, the references).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summarize_trace_replay import _stats, fmt, seed_of  # noqa: E402

from trace_replay.policies import NATIVE  # noqa: E402

CREDIT = "histate credit"


def _load(d: Path, pattern: str) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(d.glob(pattern))}


def rows(name: str, base: dict[str, dict], credit: dict[str, dict]) -> list[str]:
    """Rows for one workload; runs are paired by admission order (seed)."""
    cs = {seed_of(k): v for k, v in credit.items()}
    pairs = sorted((seed_of(k), v, cs[seed_of(k)]) for k, v in base.items() if seed_of(k) in cs)
    if not pairs:
        return []
    k = len(pairs)
    name = f"{name} ({k})"
    arrs: dict[str, list[np.ndarray]] = {}
    rec: dict[str, list[float]] = {}
    for n in ("histate", "unlimited-host", "unlimited", *NATIVE):
        if all(n in b["per_request"]["ttft"] for _, b, _ in pairs):
            arrs[n] = [np.asarray(b["per_request"]["ttft"][n], float) for _, b, _ in pairs]
            rec[n] = [b[n].get("recovery") for _, b, _ in pairs]
    arrs[CREDIT] = [np.asarray(c["per_request"]["ttft"]["histate"], float) for _, _, c in pairs]
    rec[CREDIT] = [c["histate"].get("recovery") for _, _, c in pairs]
    native = [n for n in NATIVE if n in arrs]
    best = min(native, key=lambda n: np.concatenate(arrs[n]).mean())
    ref = np.concatenate(arrs["unlimited"]).mean()
    uh = np.concatenate(arrs["unlimited-host"]).mean()
    cm = [_stats(x) for x in arrs[CREDIT]]
    out = []
    for n, label in (("histate", "histate"), (CREDIT, CREDIT), (best, f"native best ({best})"),
                     ("unlimited-host", "unlimited-host")):
        mean, p95, p99 = _stats(np.concatenate(arrs[n]))
        r = [x for x in rec[n] if x is not None and not math.isnan(x)]
        if n == CREDIT:
            ok = "-"
        else:
            om = [_stats(x) for x in arrs[n]]
            ok = ", ".join(f"{sum(cm[i][j] <= om[i][j] for i in range(k))}/{k}"
                           for j in range(3))
        out.append(f"| {name} | {label} | {mean:.4f} | {p95:.3f} | {p99:.2f} | "
                   f"{fmt(sum(r) / len(r) if r else None, '.1%')} | {mean / ref - 1:+.1%} | "
                   f"{mean / uh - 1:+.1%} | {ok} |")
    return out


SHAPES = ("40 sessions x 100 turns", "96 sessions x 50 turns",
          "4,096-token system prompt, 2,048-token turns",
          "16,384-token system prompt, 600-token turns", "forks on (2 subagents every 8 turns)")


def main() -> None:
    credit = Path(sys.argv[1])
    dirs = {k: Path(v) for k, v in (a.split("=", 1) for a in sys.argv[2:])}
    print("| workload (orders) | policy | mean s | p95 s | p99 s | recovery | vs Unlimited | "
          "vs Unlimited-host | orders credit <= it: mean, p95, p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    first = next(iter(dirs.values()))
    # (label, folder of the default policy's runs, their pattern, credit's pattern)
    groups = [("TraceLab-like mix", first, "tl-s*.json", "tl-s*.json")]
    groups += [(f"mix: {s}", credit, f"base-shape{i}-s*.json", f"shape{i}-s*.json")
               for i, s in enumerate(SHAPES)]
    groups += [("Mooncake conversation", first, "mooncake-s*.json", "mooncake-s*.json")]
    groups += [(f"mutation p={p}", first, f"mut-p{p}-s*.json", f"mut-p{p}-s*.json")
               for p in ("0", "0.02", "0.05", "0.1")]
    for folder, d in dirs.items():
        for rep, label in (("paper", "paper-like"), ("shared4", "4 prefills"), ("raw", "raw")):
            groups.append((f"{folder} {label}", d, f"weka-{rep}-s*.json",
                           f"{folder}-{rep}-s*.json"))
    for name, d, bpat, cpat in groups:
        for line in rows(name, _load(d, bpat), _load(credit, cpat)):
            print(line)


if __name__ == "__main__":
    main()
