"""Markdown tables for benchmarks/results_trace_replay.md from `simulate --json` reports.

    python benchmarks/summarize_trace_replay.py RESULTS_DIR > tables.md
    python benchmarks/summarize_trace_replay.py --into benchmarks/results_trace_replay.md \
        weka=OUT/weka weka-more=OUT/weka-more

A RESULTS_DIR holds weka-paper-sS.json, weka-shared4-sS.json, weka-raw-sS.json and, with
the synthetic workloads, mut-pP-sS.json, tl-sS.json and mooncake-sS.json
(benchmarks/trace_replay_all.sh writes them). `--into` rewrites the file's generated
blocks, each between `<!-- generated: NAME -->` and `<!-- /generated -->`: `headline`
(every folder), `NAME` (one folder's tables) and `synthetic` (the synthetic workloads and
Mooncake's trace, from the first folder that has them); the prose around them is the
file's own.
"""

from __future__ import annotations

import functools
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
from results_blocks import write_into  # noqa: E402  (beside this script)
from trace_replay.policies import NATIVE  # noqa: E402

BASELINES = ("vllm-marconi", "vllm-cpu", "vllm-disk", "sglang-hicache")
VARIANTS = ("vllm-disk-align", "sglang-hicache-chunks")
ABLATIONS = ("histate-mirror", "align", "fixed-32", "lru-disk")
ORDER = ("histate", *BASELINES, *VARIANTS, "unlimited", "unlimited-host", *ABLATIONS, *NATIVE)


@functools.cache  # the headline and each folder's tables read the same reports (read-only)
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
    pols = [n for n in ORDER if all(n in reps[k] for k in names) and n not in NATIVE]
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


REPLAYS = {"paper": "paper-like replay", "shared4": "paper-like replay, 4 prefills at once",
           "raw": "raw replay"}
# The rows of the comparison tables: HiState's ablations, then what a user would pick instead.
RIVALS = (*ABLATIONS, "native best", *BASELINES, *VARIANTS, "unlimited-host", "unlimited")


def _runs(reps: dict[str, dict]) -> tuple[list[str], dict[str, list[np.ndarray]], dict]:
    """(run names by seed, per-request TTFT arrays per policy per run, recovery per policy
    per run), with "native best" = the native setting of lowest pooled mean."""
    names = sorted(reps, key=seed_of)
    per = [reps[k]["per_request"]["ttft"] for k in names]
    pols = [n for n in ORDER if all(n in p for p in per)]
    arrs = {n: [np.asarray(p[n], dtype=float) for p in per] for n in pols}
    rec = {n: [reps[k][n].get("recovery") for k in names] for n in pols}
    native = [n for n in NATIVE if n in arrs]
    if native:
        best = min(native, key=lambda n: np.concatenate(arrs[n]).mean())
        arrs["native best"], rec["native best"] = arrs[best], rec[best]
        rec["native best name"] = best
    return names, arrs, rec


def _stats(a: np.ndarray) -> tuple[float, float, float]:
    p95, p99 = np.percentile(a, [95, 99])
    return float(a.mean()), float(p95), float(p99)


def _mean_interval(h: list[np.ndarray], o: list[np.ndarray], rounds: int = 2000
                   ) -> tuple[float, float]:
    """95% interval of HiState's pooled mean over another's, admission orders resampled
    (paired: the same orders for both)."""
    k = len(h)
    if k < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(0)
    hs = np.array([x.sum() for x in h])
    os_ = np.array([x.sum() for x in o])
    picks = rng.integers(0, k, size=(rounds, k))
    r = hs[picks].sum(1) / os_[picks].sum(1)
    lo, hi = np.percentile(r, [2.5, 97.5])
    return float(lo), float(hi)


def comparison(reps: dict[str, dict]) -> str:
    """Pooled over every order, each rival beside HiState, and per order how often HiState's
    mean, p95 and p99 are at or below the rival's."""
    names, arrs, rec = _runs(reps)
    k = len(names)
    ref = np.concatenate(arrs["unlimited"]).mean()
    h = arrs["histate"]
    hm = [_stats(x) for x in h]
    rows = ["| policy | mean s | p95 s | p99 s | recovery | mean vs Unlimited | HiState mean / "
            "it (95% interval) | orders HiState <= it: mean, p95, p99 | mean per order |",
            "|---|---|---|---|---|---|---|---|---|"]
    for n in ("histate", *RIVALS):
        if n not in arrs:
            continue
        a = arrs[n]
        mean, p95, p99 = _stats(np.concatenate(a))
        r = [x for x in rec[n] if x is not None and not math.isnan(x)]
        label = f"native best ({rec['native best name']})" if n == "native best" else n
        per = " / ".join(f"{x.mean():.4f}" for x in a)
        if n == "histate":
            cmp_, ok = "-", "-"
        else:
            lo, hi = _mean_interval(h, a)
            ratio = np.concatenate(h).sum() / np.concatenate(a).sum()
            cmp_ = f"{ratio:.3f} ({lo:.3f}-{hi:.3f})"
            om = [_stats(x) for x in a]
            ok = ", ".join(f"{sum(hm[i][j] <= om[i][j] for i in range(k))}/{k}"
                           for j in range(3))
        rows.append(f"| {label} | {mean:.4f} | {p95:.3f} | {p99:.2f} | "
                    f"{fmt(sum(r) / len(r) if r else None, '.1%')} | {mean / ref - 1:+.1%} | "
                    f"{cmp_} | {ok} | {per} |")
    return "\n".join(rows)


GAP_RIVALS = (*ABLATIONS, "native best")


def gap_sources(reps: dict[str, dict]) -> str:
    """HiState's mean TTFT minus a rival's, split by request: those both policies resumed at
    the same point with the same SSD read, where they differ only in when the closed loop
    sent the request, what it queued behind and whether its KV was still on the GPU or came
    from DRAM, and those where the two restored differently. Both parts are sums over every
    request divided by their number, so they add up to the difference."""
    names, arrs, rec = _runs(reps)
    rows = ["| rival | HiState - it, mean ms | of which same hit and read | of which different "
            "| requests decided differently | per order: HiState - it (same-hit part), ms |",
            "|---|---|---|---|---|---|"]

    def restored(k: str, pol: str) -> tuple[np.ndarray, np.ndarray]:
        pr = reps[k]["per_request"]
        return np.asarray(pr["hit"][pol]), np.asarray(pr["ssd_mb"][pol])

    ours = {k: restored(k, "histate") for k in names}
    for n in GAP_RIVALS:
        if n not in arrs:
            continue
        pol = rec["native best name"] if n == "native best" else n
        label = f"native best ({pol})" if n == "native best" else n
        tot = same_t = 0.0
        count = differ = 0
        per = []
        for k, h, o in zip(names, arrs["histate"], arrs[n]):
            (hit, ssd), (their_hit, their_ssd) = ours[k], restored(k, pol)
            same = (hit == their_hit) & (ssd == their_ssd)
            d = h - o
            tot += d.sum()
            same_t += d[same].sum()
            count += len(d)
            differ += int((~same).sum())
            per.append(f"{d.mean() * 1e3:+.1f} ({d[same].sum() / len(d) * 1e3:+.1f})")
        rows.append(f"| {label} | {tot / count * 1e3:+.2f} | {same_t / count * 1e3:+.2f} | "
                    f"{(tot - same_t) / count * 1e3:+.2f} | {differ / count:.1%} | "
                    f"{' / '.join(per)} |")
    return "\n".join(rows)


def headline(dirs: dict[str, Path]) -> str:
    """Per folder and replay: HiState, its best ablation, the best native setting and the
    best baseline, pooled means against Unlimited's."""
    rows = ["| traces | replay | requests | HiState vs Unlimited | Unlimited-host (any "
            "offloading cache's limit) | best ablation | best native (vLLM 0.34) | best other "
            "baseline | HiState / best native, mean (95% interval) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for label, d in dirs.items():
        for kind, title in REPLAYS.items():
            reps = load(d, f"weka-{kind}-s*.json")
            if not reps:
                continue
            names, arrs, rec = _runs(reps)
            m = {n: np.concatenate(a).mean() for n, a in arrs.items()}
            ref = m["unlimited"]

            def best(group):
                got = [n for n in group if n in m]
                if not got:
                    return "-"
                b = min(got, key=m.get)
                return f"{b} {m[b] / ref - 1:+.1%}"
            nat = rec.get("native best name")
            lo, hi = _mean_interval(arrs["histate"], arrs["native best"]) if nat else (0, 0)
            rows.append(
                f"| {label} | {title} ({len(names)} orders) | "
                f"{sum(len(x) for x in arrs['histate'])} | {m['histate'] / ref - 1:+.1%} | "
                f"{fmt(m.get('unlimited-host', math.nan) / ref - 1, '+.1%')} | {best(ABLATIONS)} | {nat} {m['native best'] / ref - 1:+.1%} | "
                f"{best((*BASELINES, *VARIANTS))} | "
                f"{m['histate'] / m['native best']:.3f} ({lo:.3f}-{hi:.3f}) |")
    return "\n".join(rows)


def noise(base: dict[str, dict], jit: dict[str, dict], kind: str) -> str:
    """How far each order's numbers move when the GPU is 0.02% faster (jitter-KIND-sS.json
    beside weka-KIND-sS.json): the replay's own noise, which no policy decision sees."""
    pairs = [(base[f"weka-{kind}-s{seed_of(k)}"], jit[k]) for k in sorted(jit, key=seed_of)
             if f"weka-{kind}-s{seed_of(k)}" in base]
    if not pairs:
        return ""
    pols = [n for n in ORDER if all(n in a and n in b for a, b in pairs)]
    rows = ["| policy | mean: largest move of one order | p95 | p99 | pooled mean |",
            "|---|---|---|---|---|"]
    for n in pols:
        cells = []
        for key in ("ttft_mean", "ttft_p95", "ttft_p99"):
            cells.append(f"{max(abs(b[n][key] / a[n][key] - 1) for a, b in pairs):.1%}")
        pa = np.concatenate([np.asarray(a["per_request"]["ttft"][n]) for a, _ in pairs])
        pb = np.concatenate([np.asarray(b["per_request"]["ttft"][n]) for _, b in pairs])
        cells.append(f"{abs(pb.mean() / pa.mean() - 1):.1%}")
        rows.append(f"| {n} | {' | '.join(cells)} |")
    return "\n".join(rows)


def folder(d: Path) -> str:
    out = []
    for kind, title in REPLAYS.items():
        reps = load(d, f"weka-{kind}-s*.json")
        if not reps:
            continue
        out += [f"#### {title}", "", f"{len(reps)} admission orders, pooled:", "",
                comparison(reps), "",
                "Where HiState's difference to each ablation and to the native best comes "
                "from:", "", gap_sources(reps), ""]
        jit = load(d, f"jitter-{kind}-s*.json")
        nz = noise(reps, jit, kind)
        if nz:
            out += [f"The replay's own noise, {len(jit)} orders rerun with the GPU 0.02% "
                    "faster:", "", nz, ""]
        out += ["vLLM 0.34's native offloading at every swept setting, pooled:", "",
                native_best(reps), "",
                "Mean TTFT by request class, every order pooled:", "", classes_pooled(reps), "",
                "Where recovery is lost, per order:", "", recovery_losses(reps), "",
                "Restart survival and the SSD tier, per order:", "", hierarchy(reps), ""]
    return "\n".join(out).rstrip() + "\n"


def synthetic(d: Path) -> str:
    out = ["#### Mutation microbenchmark", "", mutation(d), ""]
    tl = load(d, "tl-s*.json")
    if tl:
        out += ["#### TraceLab-like workload", "", comparison(tl), ""]
    mc = load(d, "mooncake-s*.json")
    if mc:
        out += ["#### Mooncake conversation trace", "", comparison(mc), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--into":
        target_file = Path(args[1])
        dirs = dict(a.split("=", 1) for a in args[2:])
        dirs = {k: Path(v) for k, v in dirs.items()}
        blocks = {"headline": headline(dirs)}
        blocks.update({k: folder(d) for k, d in dirs.items()})
        synth = next((d for d in dirs.values() if list(d.glob("mut-p*-s*.json"))), None)
        if synth is not None:
            blocks["synthetic"] = synthetic(synth)
        write_into(target_file, blocks)
        return
    d = Path(args[0])
    print(f"{headline({d.name: d})}\n\n{folder(d)}")
    if list(d.glob("mut-p*-s*.json")):
        print(synthetic(d))


if __name__ == "__main__":
    main()
