"""Metric definitions (HiState paper §4.1-4.2).

* TTFT percentiles over all requests (arrival to first token, queueing and restore included).
* Token hit rate: tokens reused without recomputation / input tokens. A KV match without a
  state at its end is not reuse: a policy's `hit` is its resume point, which always has one.
* Reuse-sensitive requests: vLLM-Disk's hit rate is >= 5 points below Unlimited's, or HiState's
  and vLLM-Disk's differ by >= 5 points (per-request hit rate = hit / input tokens).
* Recovery of policy X: sum of X's reused tokens over the reuse-sensitive requests / sum of
  Unlimited's reused tokens over the same requests.
"""

from __future__ import annotations

import numpy as np

SENSITIVITY = 0.05
REFERENCES = ("unlimited", "vllm-disk", "histate")


def percentiles(ttft: np.ndarray) -> dict[str, float]:
    if len(ttft) == 0:
        return {"ttft_p50": float("nan"), "ttft_p95": float("nan"), "ttft_p99": float("nan"),
                "ttft_mean": float("nan")}
    p50, p95, p99 = np.percentile(ttft, [50, 95, 99])
    return {"ttft_p50": float(p50), "ttft_p95": float(p95), "ttft_p99": float(p99),
            "ttft_mean": float(np.mean(ttft))}


def hit_rate(hit: np.ndarray, input_tokens: np.ndarray) -> float:
    total = int(np.sum(input_tokens))
    return float(np.sum(hit) / total) if total else 0.0


def per_request_rate(hit: np.ndarray, input_tokens: np.ndarray) -> np.ndarray:
    return np.divide(hit, input_tokens, out=np.zeros(len(hit)), where=input_tokens > 0)


def reuse_sensitive(input_tokens: np.ndarray, unlimited: np.ndarray, disk: np.ndarray,
                    histate: np.ndarray, threshold: float = SENSITIVITY) -> np.ndarray:
    """Boolean mask of the reuse-sensitive requests (hits are token counts)."""
    u = per_request_rate(unlimited, input_tokens)
    d = per_request_rate(disk, input_tokens)
    h = per_request_rate(histate, input_tokens)
    eps = 1e-9
    return (d <= u - threshold + eps) | (np.abs(h - d) >= threshold - eps)


def recovery(hit: np.ndarray, unlimited: np.ndarray, mask: np.ndarray) -> float:
    ref = int(np.sum(unlimited[mask]))
    return float(np.sum(hit[mask]) / ref) if ref else float("nan")


def summarize(ttft: np.ndarray, hit: np.ndarray, input_tokens: np.ndarray,
              labels: np.ndarray, unlimited: np.ndarray | None,
              mask: np.ndarray | None) -> dict:
    out = percentiles(ttft)
    out["hit_rate"] = hit_rate(hit, input_tokens)
    if unlimited is not None and mask is not None and mask.any():
        out["recovery"] = recovery(hit, unlimited, mask)
        out["sensitive_ttft_mean"] = float(np.mean(ttft[mask]))
        out["sensitive_hit_rate_mean"] = float(np.mean(per_request_rate(hit, input_tokens)[mask]))
    else:
        out["recovery"] = float("nan")
    for label in sorted(set(labels.tolist()) - {""}):
        m = labels == label
        if label in ("mutation", "rewind", "truncate", "compact"):
            out[f"{label}_ttft_mean"] = float(np.mean(ttft[m]))
            out[f"{label}_hit_rate"] = hit_rate(hit[m], input_tokens[m])
            out[f"{label}_count"] = int(m.sum())
    return out


# Request classes, from the workload alone, so every policy is compared on the
# same requests: what a cache could give a request depends on where its prompt leaves what
# was sent before it.
CLASSES = ("append", "internal", "fork", "cold")


def request_classes(blocks: list[list[int]], sessions: list[str], order) -> list[str]:
    """Per request (indexed like `blocks`): `append` = its session's previous prompt is a
    prefix of it (the next turn); `internal` = it leaves a context of its own session before
    that context's end (a rewind or rewrite); `fork` = its longest prefix sent before came
    from another session (a subagent, or a prompt shared across sessions); `cold` = no full
    block of it was sent before. `order`: the requests in the order they were sent. Block
    ids are chained (an id names its whole prefix)."""
    owner: dict[int, str] = {}  # block id -> the session that first sent it
    last: dict[str, list[int]] = {}  # session -> its previous prompt's blocks
    out = [""] * len(blocks)
    for i in order:
        b, s = blocks[i], sessions[i]
        m = 0
        while m < len(b) and b[m] in owner:
            m += 1
        prev = last.get(s)
        if m == 0:
            cls = "cold"
        elif prev and len(prev) <= m and b[len(prev) - 1] == prev[-1]:
            cls = "append"
        elif owner[b[m - 1]] == s:
            cls = "internal"
        else:
            cls = "fork"
        out[i] = cls
        for x in b:
            owner.setdefault(x, s)
        last[s] = b
    return out


def cold_blocks(blocks: list[list[int]], classes) -> set[int]:
    """The blocks of the `cold` requests (`request_classes`): a session's first prompts.
    Block ids are chained, so every block of a cold request was first computed there."""
    return {x for b, c in zip(blocks, classes) if c == "cold" for x in b}


def recovery_losses(hit: np.ndarray, shared: np.ndarray, unlimited: np.ndarray,
                    mask: np.ndarray, blocks: list[list[int]], block_tokens: int,
                    first: set[int]) -> dict:
    """Where Unlimited's reuse over the reuse-sensitive requests went, as shares of it:
    `lost_kv` (the policy no longer held the KV Unlimited reused), `lost_no_state` (it held
    the KV, but no state at or near the divergence: the gap to its deepest checkpoint), and
    of the latter `lost_no_state_first_segment`, where the divergence lies in one of the
    blocks `first` (`cold_blocks`: a session's first prompts)."""
    ref = int(np.sum(unlimited[mask]))
    if not ref:
        return {}
    kv = no_state = head = 0
    for i in np.flatnonzero(mask):
        u, h = int(unlimited[i]), int(hit[i])
        s = min(max(int(shared[i]), h), u)
        kv += max(0, u - max(s, h))
        gap = max(0, s - h)
        no_state += gap
        if gap and blocks[i][s // block_tokens - 1] in first:
            head += gap
    return {"lost_kv": kv / ref, "lost_no_state": no_state / ref,
            "lost_no_state_first_segment": head / ref}


def class_means(ttft: np.ndarray, classes: np.ndarray) -> dict:
    """Mean TTFT and count per request class."""
    out = {}
    for c in CLASSES:
        m = classes == c
        if m.any():
            out[c] = {"count": int(m.sum()), "ttft_mean": float(np.mean(ttft[m]))}
    return out
