"""summarize_trace_replay.gap_sources: HiState's difference to a rival, split into requests
both resumed alike (queueing) and requests they restored differently."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from summarize_trace_replay import gap_sources  # noqa: E402


def _report(ttft: dict, hit: dict, ssd: dict) -> dict:
    return {"per_request": {"ttft": ttft, "hit": hit, "ssd_mb": ssd},
            **{p: {"recovery": None} for p in ttft}}


def test_parts_add_up_and_split_by_decision():
    pols = ("histate", "align", "unlimited")
    # Order 0: request 0 resumed alike (queueing: +1 s), request 1 restored differently.
    r0 = _report(ttft={"histate": [2.0, 1.0], "align": [1.0, 0.5], "unlimited": [1.0, 0.5]},
                 hit={p: [100, 200 if p == "histate" else 100] for p in pols},
                 ssd={p: [0.0, 0.0] for p in pols})
    # Order 1: every request alike except its SSD read on request 1.
    r1 = _report(ttft={"histate": [1.0, 1.0], "align": [1.0, 2.0], "unlimited": [1.0, 1.0]},
                 hit={p: [100, 100] for p in pols},
                 ssd={p: [0.0, 5.0 if p == "align" else 0.0] for p in pols})
    table = gap_sources({"weka-raw-s0": r0, "weka-raw-s1": r1})
    row = next(line for line in table.splitlines() if line.startswith("| align |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Pooled over 4 requests: (1 + 0.5 + 0 - 1) / 4 s = +125 ms; alike: request 0 of
    # order 0 and request 0 of order 1, +1 s / 4 = +250 ms; the rest -125 ms.
    assert cells[1:5] == ["+125.00", "+250.00", "-125.00", "50.0%"]
    assert cells[5] == "+750.0 (+500.0) / -500.0 (+0.0)"
