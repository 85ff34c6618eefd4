"""Markdown tables for benchmarks/results_trace_replay.md from `simulate --json` reports.

    python benchmarks/summarize_trace_replay.py RESULTS_DIR > tables.md

RESULTS_DIR holds weka-paper-sS.json, weka-shared4-sS.json, weka-raw-sS.json,
mut-pP-sS.json and tl-sS.json (benchmarks/trace_replay_all.sh writes them).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout: nothing installed

# vLLM 0.34's own hybrid offloading, every swept setting, named where the simulator defines it.
from trace_replay.policies import NATIVE  # noqa: E402

BASELINES = ("vllm-marconi", "vllm-cpu", "vllm-disk", "sglang-hicache")
VARIANTS = ("vllm-disk-align", "sglang-hicache-chunks")
ABLATIONS = ("histate-mirror", "align", "fixed-32", "lru-disk")
ORDER = ("histate", *BASELINES, *VARIANTS, "unlimited", *ABLATIONS, *NATIVE)


def load(d: Path, pattern: str) -> dict[str, dict]:
    out = {}
    for p in sorted(d.glob(pattern)):
        out[p.stem] = json.loads(p.read_text())
    return out


def seed_of(name: str) -> int:
    return int(re.search(r"-s(\d+)$", name).group(1))


def fmt(x, spec=".3f"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def full_table(rep: dict) -> str:
    rows = ["| policy | p50 s | p95 s | p99 s | mean s | hit rate | recovery |",
            "|---|---|---|---|---|---|---|"]
    for n in ORDER:
        if n not in rep:
            continue
        m = rep[n]
        rows.append(f"| {n} | {fmt(m['ttft_p50'])} | {fmt(m['ttft_p95'])} | "
                    f"{fmt(m['ttft_p99'])} | {fmt(m['ttft_mean'])} | {m['hit_rate']:.2%} | "
                    f"{fmt(m.get('recovery'), '.1%')} |")
    return "\n".join(rows)


def seeds_table(reps: dict[str, dict]) -> str:
    names = sorted(reps, key=seed_of)
    first = reps[names[0]]
    pols = [n for n in ORDER if n in first]
    rows = ["| policy | p99 s per seed | p99 mean | histate p99 <= it | recovery per seed | "
            "recovery mean | hit rate mean |", "|---|---|---|---|---|---|---|"]
    hs = [reps[k]["histate"]["ttft_p99"] for k in names]
    for n in pols:
        p99 = [reps[k][n]["ttft_p99"] for k in names]
        rec = [reps[k][n].get("recovery") for k in names]
        hit = [reps[k][n]["hit_rate"] for k in names]
        le = "-" if n == "histate" else f"{sum(h <= b for h, b in zip(hs, p99))}/{len(names)}"
        rows.append(f"| {n} | {' / '.join(fmt(x, '.2f') for x in p99)} | "
                    f"{sum(p99) / len(p99):.2f} | {le} | "
                    f"{' / '.join(fmt(x, '.1%') for x in rec)} | "
                    f"{fmt(sum(rec) / len(rec), '.1%')} | {sum(hit) / len(hit):.2%} |")
    return "\n".join(rows)


def target(reps: dict[str, dict]) -> str:
    names = sorted(reps, key=seed_of)
    lines = []
    for k in names:
        r = reps[k]
        h = r["histate"]["ttft_p99"]
        worse = [n for n in (*BASELINES, *VARIANTS) if n in r and r[n]["ttft_p99"] < h]
        lines.append(f"seed {seed_of(k)}: histate p99 {h:.3f} s, recovery "
                     f"{r['histate']['recovery']:.1%}; baselines with a lower p99: "
                     f"{', '.join(worse) if worse else 'none'}")
    return "\n".join(f"- {x}" for x in lines)


def target_by_policy(reps: dict[str, dict]) -> str:
    """The same per-seed test applied to every policy, the oracle included: how often a
    policy's p99 is at or below every baseline and variant other than itself."""
    names = sorted(reps, key=seed_of)
    pols = [n for n in ORDER if all(n in reps[k] for k in names)]
    rivals = [n for n in (*BASELINES, *VARIANTS) if n in pols]
    rows = ["| policy | seeds meeting it | seeds with the lowest p99 of all |", "|---|---|---|"]
    for n in pols:
        meets = lowest = 0
        for k in names:
            p = reps[k][n]["ttft_p99"]
            meets += all(p <= reps[k][b]["ttft_p99"] for b in rivals if b != n)
            lowest += p <= min(reps[k][m]["ttft_p99"] for m in pols)
        rows.append(f"| {n} | {meets}/{len(names)} | {lowest}/{len(names)} |")
    return "\n".join(rows)


def pooled(reps: dict[str, dict]) -> str:
    """TTFT over the requests of every seed together: one seed's p99 is its ~33 slowest
    requests, set by which of them queue behind a cold 130-260K-token prefill."""
    names = sorted(reps, key=seed_of)
    per = [reps[k].get("per_request", {}).get("ttft", {}) for k in names]
    if not all(per):
        return "(per-request arrays left out of the reports)"
    pols = [n for n in ORDER if all(n in p for p in per)]
    arrs = {n: [np.asarray(p[n], dtype=float) for p in per] for n in pols}
    t = {n: np.concatenate(a) for n, a in arrs.items()}
    h99 = np.percentile(t["histate"], 99)
    lo_hi = _ratio_interval(arrs)
    rows = ["| policy | requests | p50 s | p95 s | p99 s | mean s | histate p99 / it | "
            "95% interval, seeds resampled |", "|---|---|---|---|---|---|---|---|"]
    for n in pols:
        p50, p95, p99 = np.percentile(t[n], [50, 95, 99])
        lo, hi = lo_hi.get(n, (math.nan, math.nan))
        rows.append(f"| {n} | {len(t[n])} | {p50:.3f} | {p95:.3f} | {p99:.3f} | "
                    f"{t[n].mean():.3f} | {h99 / p99:.3f} | "
                    f"{'-' if n == 'histate' else f'{lo:.3f}-{hi:.3f}'} |")
    return "\n".join(rows)


def native_best(reps: dict[str, dict]) -> str:
    """vLLM 0.34's native offloading at each setting, pooled over the seeds, its best
    setting (lowest pooled mean) as its own row, beside HiState and Unlimited."""
    names = sorted(reps, key=seed_of)
    per = [reps[k].get("per_request", {}).get("ttft", {}) for k in names]
    pols = [n for n in NATIVE if per and all(n in p for p in per)]
    if not pols or not all("histate" in p and "unlimited" in p for p in per):
        return "(no native runs in these reports)"
    t = {n: np.concatenate([np.asarray(p[n], dtype=float) for p in per])
         for n in (*pols, "histate", "unlimited")}
    best = min(pols, key=lambda n: t[n].mean())
    ref = t["unlimited"].mean()
    rows = ["| policy | mean s | p95 s | p99 s | mean vs Unlimited |", "|---|---|---|---|---|"]
    for n in (*pols, f"best: {best}", "histate", "unlimited"):
        a = t[n.removeprefix("best: ")]
        p95, p99 = np.percentile(a, [95, 99])
        rows.append(f"| {n} | {a.mean():.4f} | {p95:.3f} | {p99:.3f} | "
                    f"{a.mean() / ref - 1:+.1%} |")
    return "\n".join(rows)


def _ratio_interval(arrs: dict[str, list[np.ndarray]], rounds: int = 1000
                    ) -> dict[str, tuple[float, float]]:
    """95% interval of HiState's pooled p99 over each policy's, resampling whole seeds
    (an admission order is one timeline: its requests are not independent draws)."""
    k = len(arrs["histate"])
    if k < 2:
        return {}
    rng = np.random.default_rng(0)
    picks = rng.integers(0, k, size=(rounds, k))
    p99 = {n: np.array([np.percentile(np.concatenate([a[i] for i in pick]), 99)
                        for pick in picks]) for n, a in arrs.items()}
    out = {}
    for n, v in p99.items():
        lo, hi = np.percentile(p99["histate"] / v, [2.5, 97.5])
        out[n] = (float(lo), float(hi))
    return out


def hierarchy(reps: dict[str, dict]) -> str:
    names = sorted(reps, key=seed_of)
    rows = ["| seed | policy | restart survival | tau s (learned) | DRAM->SSD moves | "
            "SSD GB restored | recovery |", "|---|---|---|---|---|---|---|"]
    for k in names:
        for n in ("histate", "histate-mirror"):
            if n not in reps[k]:
                continue
            m = reps[k][n]
            st = m["stats"]
            rows.append(f"| {seed_of(k)} | {n} | {fmt(st.get('restart_survival'), '.1%')} | "
                        f"{fmt(st.get('tau_s'), '.0f')} | {st.get('spills', 0)} | "
                        f"{m['restored_ssd_gb']} | {fmt(m.get('recovery'), '.1%')} |")
    return "\n".join(rows)


CLASSES = ("append", "internal", "fork", "cold")
SIDE_BY_SIDE = ("histate", "vllm-disk")


def _cls(m: dict, c: str) -> str:
    x = m.get("classes", {}).get(c)
    return "-" if x is None else f"{x['ttft_mean']:.3f}"


def bytes_and_classes(reps: dict[str, dict]) -> str:
    """Per run: bytes restored per tier, SSD bytes read and written (and dropped by the
    write queue), mean TTFT by request class (trace_replay.metrics.request_classes)."""
    names = sorted(reps, key=seed_of)
    first = reps[names[0]]
    counts = " / ".join(f"{c} {first['histate'].get('classes', {}).get(c, {}).get('count', 0)}"
                        for c in CLASSES)
    rows = [f"Requests per class at seed 0: {counts}.", "",
            "| seed | policy | DRAM GB restored | SSD GB read | SSD GB written | "
            "SSD GB dropped (writes) | mean s | append s | internal s | fork s | cold s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in names:
        for n in SIDE_BY_SIDE:
            if n not in reps[k]:
                continue
            m = reps[k][n]
            st = m["stats"]
            rows.append(
                f"| {seed_of(k)} | {n} | {m['restored_dram_gb']:.0f} | "
                f"{m['restored_ssd_gb']:.0f} | {fmt(st.get('ssd_written_gb'), '.0f')} | "
                f"{fmt(st.get('ssd_write_gb_dropped'), '.0f')} "
                f"({st.get('ssd_writes_dropped', '-')}) | {m['ttft_mean']:.3f} | "
                + " | ".join(_cls(m, c) for c in CLASSES) + " |")
    return "\n".join(rows)


def classes_pooled(reps: dict[str, dict]) -> str:
    """Mean TTFT by request class over every seed's requests, every policy."""
    names = sorted(reps, key=seed_of)
    pols = [n for n in ORDER if all(n in reps[k] for k in names)]
    rows = ["| policy | mean s | append s | internal s | fork s | cold s | SSD GB read per run "
            "| SSD GB written per run |", "|---|---|---|---|---|---|---|---|"]
    tot = {c: sum(reps[k]["histate"].get("classes", {}).get(c, {}).get("count", 0)
                  for k in names) for c in CLASSES}
    for n in pols:
        cells = []
        for c in CLASSES:
            xs = [reps[k][n].get("classes", {}).get(c) for k in names]
            xs = [x for x in xs if x]
            cnt = sum(x["count"] for x in xs)
            cells.append(f"{sum(x['ttft_mean'] * x['count'] for x in xs) / cnt:.3f}"
                         if cnt else "-")
        mean = sum(reps[k][n]["ttft_mean"] for k in names) / len(names)
        rd = sum(reps[k][n]["restored_ssd_gb"] for k in names) / len(names)
        wr = [reps[k][n]["stats"].get("ssd_written_gb") for k in names]
        wr = sum(wr) / len(wr) if None not in wr else None
        rows.append(f"| {n} | {mean:.3f} | {' | '.join(cells)} | {rd:.0f} | "
                    f"{fmt(wr, '.0f')} |")
    rows.append(f"| (requests, all seeds) | | {' | '.join(str(tot[c]) for c in CLASSES)} | | |")
    return "\n".join(rows)


LOSS_POLICIES = ("histate", "histate-mirror", "vllm-disk")


def recovery_losses(reps: dict[str, dict]) -> str:
    """Where Unlimited's reuse over the sensitive requests went, per run (metrics.py's
    `recovery_losses`): restored, KV gone, KV held without a state near the divergence
    (of which inside a session's first prompt)."""
    names = sorted(reps, key=seed_of)
    pols = [p for p in LOSS_POLICIES if p in reps[names[0]]]
    rows = ["| order | " + " | ".join(f"{p}: recovered / KV gone / no state (first prompt)"
                                      for p in pols) + " |",
            "|---" * (len(pols) + 1) + "|"]
    for k in names:
        cells = []
        for p in pols:
            m = reps[k][p]
            lo = m.get("recovery_losses")
            if not lo:
                cells.append("-")
                continue
            cells.append(f"{fmt(m.get('recovery'), '.1%')} / {lo['lost_kv']:.1%} / "
                         f"{lo['lost_no_state']:.1%} ({lo['lost_no_state_first_segment']:.1%})")
        rows.append(f"| {seed_of(k)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def mutation(d: Path) -> str:
    reps = load(d, "mut-p*-s*.json")
    by_p: dict[str, list[dict]] = {}
    for k, r in reps.items():
        p = re.search(r"mut-p([0-9.]+)-s", k).group(1)
        by_p.setdefault(p, []).append(r)
    rows = ["| p | policy | p99 s (mean) | p99 s per seed | hit rate | recovery | "
            "mutation-request TTFT s |", "|---|---|---|---|---|---|---|"]
    for p in sorted(by_p, key=float):
        rs = by_p[p]
        for n in ORDER:
            if n not in rs[0] or n in ("align", "fixed-32", "lru-disk"):
                continue
            p99 = [r[n]["ttft_p99"] for r in rs]
            rec = [r[n].get("recovery") for r in rs]
            rec = [x for x in rec if x is not None and not math.isnan(x)]
            mt = [r[n].get("mutation_ttft_mean") for r in rs]
            mt = [x for x in mt if x is not None and not math.isnan(x)]
            rows.append(
                f"| {float(p):.0%} | {n} | {sum(p99) / len(p99):.3f} | "
                f"{' / '.join(f'{x:.2f}' for x in p99)} | "
                f"{sum(r[n]['hit_rate'] for r in rs) / len(rs):.2%} | "
                f"{fmt(sum(rec) / len(rec), '.1%') if rec else '-'} | "
                f"{fmt(sum(mt) / len(mt)) if mt else '-'} |")
    return "\n".join(rows)


def main() -> None:
    d = Path(sys.argv[1])
    titles = {"paper": "paper-like replay", "shared4": "paper-like replay, 4 prefills at once",
              "raw": "raw replay"}
    for kind, title in titles.items():
        reps = load(d, f"weka-{kind}-s*.json")
        if not reps:
            continue
        print(f"### Weka, {title}\n")
        print(f"Seed 0, all policies:\n\n{full_table(reps[f'weka-{kind}-s0'])}\n")
        print(f"{len(reps)} admission orders:\n\n{seeds_table(reps)}\n")
        print(f"Target check (p99 at or below every baseline and variant):\n\n{target(reps)}\n")
        print(f"The same check for every policy:\n\n{target_by_policy(reps)}\n")
        print(f"All seeds pooled:\n\n{pooled(reps)}\n")
        print(f"vLLM 0.34's native offloading, swept, pooled:\n\n{native_best(reps)}\n")
        print(f"Hierarchy and restarts:\n\n{hierarchy(reps)}\n")
        print(f"Bytes and request classes per run:\n\n{bytes_and_classes(reps)}\n")
        print(f"Request classes, all seeds pooled:\n\n{classes_pooled(reps)}\n")
        print(f"Where recovery is lost, per run:\n\n{recovery_losses(reps)}\n")
    print(f"### Mutation microbenchmark\n\n{mutation(d)}\n")
    tl = load(d, "tl-s*.json")
    if tl:
        print(f"### TraceLab-like workload\n\n{seeds_table(tl)}\n")
        print(f"{target(tl)}\n")
        print(f"The same check for every policy:\n\n{target_by_policy(tl)}\n")
        print(f"All seeds pooled:\n\n{pooled(tl)}\n")


if __name__ == "__main__":
    main()
