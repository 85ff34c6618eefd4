"""Charts in the style of the HiState paper's Figures 8-11, from `simulate --json` reports.

* Fig. 8: p95/p99 TTFT speedup over vllm-marconi, one group per report (workload).
* Fig. 9: per reuse-sensitive request (sorted by Unlimited's lead over vllm-disk; requests
  where histate reuses less than vllm-disk at the right, shaded): hit rate, TTFT, TTFT
  normalised to vllm-disk. One figure per report.
* Fig. 10: ablations (histate, align, fixed-32, lru-disk): mean hit rate and mean TTFT over
  the reuse-sensitive requests.
* Fig. 11: mutation microbenchmarks (reports named mutation-p*): mean TTFT of mutation
  requests and overall p99 TTFT against the mutation rate.
* Fig. 12: TTFT CDF per policy (whole range and the tail above p90), one figure per report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

ABLATION_ORDER = ("histate", "align", "fixed-32", "lru-disk")
COLORS = {
    "histate": "#d62728", "vllm-marconi": "#7f7f7f", "vllm-cpu": "#9ecae1",
    "vllm-disk": "#3182bd", "sglang-hicache": "#31a354", "unlimited": "#000000",
    "align": "#fd8d3c", "fixed-32": "#fdae6b", "lru-disk": "#756bb1",
    "histate-mirror": "#e377c2", "vllm-disk-align": "#6baed6", "sglang-hicache-chunks": "#74c476",
    "unlimited-host": "#636363", "native": "#9467bd",
}


def _cdf_names(rep: dict) -> list[str]:
    """The CDFs' policies: every one but HiState's ablations, and of vLLM 0.34's native
    settings only the one of lowest mean (the sweep would bury the rest)."""
    names = [n for n in _names(rep) if n not in ABLATION_ORDER[1:]]
    native = [n for n in names if n.startswith("vllm034-")]
    best = min(native, key=lambda n: rep[n]["ttft_mean"]) if native else None
    return [n for n in names if not n.startswith("vllm034-") or n == best]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _names(rep: dict) -> list[str]:
    return [n for n in rep["policies"] + rep.get("references", []) if n in rep]


def fig8(reps: list[dict], out: Path) -> Path | None:
    reps = [r for r in reps if "vllm-marconi" in r]
    if not reps:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=False)
    for ax, q in zip(axes, ("ttft_p95", "ttft_p99")):
        groups = [r["workload"]["name"] for r in reps]
        pols = [n for n in _names(reps[0]) if n not in ("vllm-marconi", "unlimited")]
        width = 0.8 / max(1, len(pols))
        for i, n in enumerate(pols):
            vals = [r["vllm-marconi"][q] / r[n][q] if n in r and r[n][q] else np.nan
                    for r in reps]
            ax.bar(np.arange(len(reps)) + i * width, vals, width, label=n,
                   color=COLORS.get(n))
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(reps)) + width * (len(pols) - 1) / 2, groups)
        ax.set_ylabel(f"{q[5:]} TTFT speedup vs vllm-marconi")
    axes[1].legend(fontsize=8, ncol=2)
    return _save(fig, out / "fig8_tail_speedup.png")


def fig9(rep: dict, out: Path) -> Path | None:
    pr = rep.get("per_request")
    if not pr or not any(pr.get("sensitive") or ()) or not all(
            n in pr["hit"] for n in ("unlimited", "vllm-disk", "histate")):
        return None
    plt = _plt()
    m = np.array(pr["sensitive"], dtype=bool)
    inp = np.array(pr["input_tokens"], dtype=float)[m]
    rate = {n: np.array(pr["hit"][n], dtype=float)[m] / np.maximum(inp, 1)
            for n in ("unlimited", "vllm-disk", "histate")}
    ttft = {n: np.array(pr["ttft"][n], dtype=float)[m] for n in ("vllm-disk", "histate")}
    worse = rate["histate"] < rate["vllm-disk"] - 1e-9
    gap = rate["unlimited"] - rate["vllm-disk"]
    order = np.lexsort((-gap, worse))
    x = np.arange(len(order))
    fig, axes = plt.subplots(3, 1, figsize=(11, 7), sharex=True)
    for n in ("unlimited", "vllm-disk", "histate"):
        axes[0].plot(x, rate[n][order], ".", label=n, color=COLORS[n], ms=4)
    axes[0].set_ylabel("hit rate")
    for n in ("vllm-disk", "histate"):
        axes[1].plot(x, ttft[n][order], ".", label=n, color=COLORS[n], ms=4)
    axes[1].set_ylabel("TTFT (s)")
    axes[1].set_yscale("log")
    axes[2].plot(x, ttft["histate"][order] / np.maximum(ttft["vllm-disk"][order], 1e-9), ".",
                 color=COLORS["histate"], ms=4)
    axes[2].axhline(1.0, color="k", lw=0.8)
    axes[2].set_yscale("log")
    axes[2].set_ylabel("TTFT / vllm-disk")
    axes[2].set_xlabel("reuse-sensitive requests")
    nw = int(worse.sum())
    if nw:
        for ax in axes:
            ax.axvspan(len(order) - nw - 0.5, len(order) - 0.5, color="0.9", zorder=0)
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{rep['workload']['name']}: {len(order)} reuse-sensitive requests")
    return _save(fig, out / f"fig9_per_request_{_slug(rep['workload']['name'])}.png")


def fig12(rep: dict, out: Path) -> Path | None:
    pr = rep.get("per_request")
    if not pr:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for n in _cdf_names(rep):
        if n not in pr["ttft"]:
            continue
        t = np.sort(np.array(pr["ttft"][n], dtype=float))
        y = np.arange(1, len(t) + 1) / len(t)
        style = "--" if n in ("histate-mirror", "vllm-disk-align", "sglang-hicache-chunks",
                              "unlimited-host") else "-"
        color = COLORS.get("native" if n.startswith("vllm034-") else n)
        for ax in axes:
            ax.plot(t, y, style, label=n, color=color, lw=1.2)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("TTFT (s)")
    axes[0].set_ylabel("fraction of requests")
    axes[1].set_ylim(0.9, 1.0005)
    axes[1].set_xlabel("TTFT (s), tail")
    axes[1].legend(fontsize=7, loc="lower right")
    axes[0].set_title(f"{rep['workload']['name']}: {rep['workload']['requests']} requests")
    return _save(fig, out / f"fig12_ttft_cdf_{_slug(rep['workload']['name'])}.png", dpi=110)


CLASS_POLICIES = ("histate", "vllm-disk", "histate-mirror", "unlimited")


def fig13(reps: list[dict], out: Path, name: str = "") -> Path | None:
    """TTFT CDFs by request class (append, internal hit, fork, cold: metrics.CLASSES),
    HiState beside vLLM-Disk, over the requests of every report given (admission orders
    of one replay)."""
    from .metrics import CLASSES

    prs = [r.get("per_request") for r in reps]
    if not prs or not all(pr and pr.get("class") for pr in prs):
        return None
    plt = _plt()
    pols = [n for n in CLASS_POLICIES if all(n in pr["ttft"] for pr in prs)]
    cls = np.concatenate([np.array(pr["class"], dtype=object) for pr in prs])
    fig, axes = plt.subplots(1, len(CLASSES) + 1, figsize=(16, 3.6), sharey=True)
    for ax, c in zip(axes, ("all", *CLASSES)):
        m = np.ones(len(cls), bool) if c == "all" else cls == c
        for n in pols:
            t = np.concatenate([np.array(pr["ttft"][n], dtype=float) for pr in prs])[m]
            if not len(t):
                continue
            t = np.sort(t)
            ax.plot(t, np.arange(1, len(t) + 1) / len(t), "--" if n == "histate-mirror"
                    else "-", label=f"{n} (mean {t.mean():.3f} s)", color=COLORS.get(n), lw=1.2)
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s)")
        ax.set_title(f"{c}: {int(m.sum())} requests")
        ax.legend(fontsize=6, loc="lower right")
    axes[0].set_ylabel("fraction of requests")
    title = name or reps[0]["workload"]["name"]
    fig.suptitle(f"{title}: TTFT by request class, {len(reps)} admission order(s) pooled")
    return _save(fig, out / f"fig13_ttft_cdf_classes_{_slug(title)}.png", dpi=110)


def fig10(rep: dict, out: Path) -> Path | None:
    pols = [n for n in ABLATION_ORDER if n in rep and "sensitive_ttft_mean" in rep[n]]
    if len(pols) < 2:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    axes[0].bar(pols, [rep[n]["sensitive_hit_rate_mean"] for n in pols],
                color=[COLORS[n] for n in pols])
    axes[0].set_ylabel("mean hit rate")
    axes[1].bar(pols, [rep[n]["sensitive_ttft_mean"] for n in pols],
                color=[COLORS[n] for n in pols])
    axes[1].set_ylabel("mean TTFT (s)")
    fig.suptitle(f"{rep['workload']['name']}: ablations on reuse-sensitive requests")
    return _save(fig, out / f"fig10_ablation_{_slug(rep['workload']['name'])}.png")


def _mutation_rate(rep: dict) -> float | None:
    m = re.match(r"mutation-p([0-9.]+)", rep["workload"]["name"])
    return float(m.group(1)) if m else None


def fig11(reps: list[dict], out: Path) -> Path | None:
    pts = sorted((p, r) for r in reps if (p := _mutation_rate(r)) is not None)
    if not pts:
        return None
    plt = _plt()
    pols = [n for n in _names(pts[0][1]) if n != "unlimited"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    width = 0.8 / max(1, len(pols))
    xs = np.arange(len(pts))
    for i, n in enumerate(pols):
        a = [r[n].get("mutation_ttft_mean", np.nan) if n in r else np.nan for _, r in pts]
        b = [r[n]["ttft_p99"] if n in r else np.nan for _, r in pts]
        axes[0].bar(xs + i * width, a, width, label=n, color=COLORS.get(n))
        axes[1].bar(xs + i * width, b, width, label=n, color=COLORS.get(n))
    labels = [f"{p:.0%}" for p, _ in pts]
    for ax, yl in zip(axes, ("mean TTFT of mutation requests (s)", "p99 TTFT (s)")):
        ax.set_xticks(xs + width * (len(pols) - 1) / 2, labels)
        ax.set_xlabel("mutation rate")
        ax.set_ylabel(yl)
    axes[1].legend(fontsize=7, ncol=2)
    return _save(fig, out / "fig11_mutation.png")


def _save(fig, path: Path, dpi: int = 130) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)
    return path


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plot_reports(paths: list[Path], out: Path,
                 figures: set[int] = frozenset({8, 9, 10, 11, 12}), name: str = ""
                 ) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    reps = [json.loads(Path(p).read_text()) for p in paths]
    made: list[Path | None] = []
    if 8 in figures:
        made.append(fig8([r for r in reps if _mutation_rate(r) is None] or reps, out))
    for r in reps:
        if 9 in figures:
            made.append(fig9(r, out))
        if 10 in figures:
            made.append(fig10(r, out))
        if 12 in figures:
            made.append(fig12(r, out))
    if 11 in figures:
        made.append(fig11(reps, out))
    if 13 in figures:  # every report pooled: give the admission orders of one replay
        made.append(fig13(reps, out, name))
    return [p for p in made if p is not None]
