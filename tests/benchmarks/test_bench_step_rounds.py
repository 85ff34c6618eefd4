"""benchmarks/bench_step.py's round-by-round decode table: rounds are the samples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_saved = list(sys.path)  # as in test_demo_turns_split: never leave the checkout on sys.path
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "examples")]
try:
    round_table = pytest.importorskip("bench_step")._round_table
finally:
    sys.path[:] = _saved


def _steps(rnd: int, ms: float, n: int = 5) -> list[dict]:
    return [dict(phase="decode-8", kind="decode", round=rnd, total=ms / 1e3)] * n


def test_each_round_is_one_sample_and_the_mean_is_geometric():
    # Round 2's engines both start slow; the ratio per round is what counts.
    runs = {"vllm": _steps(0, 10.0) + _steps(1, 20.0),
            "histate": _steps(0, 11.0) + _steps(1, 20.0)
            + [dict(phase="decode-8", kind="decode+store", round=0, total=1.0)]}
    out = round_table(runs, rounds=2)
    assert "| decode-8 | 1 | 10.00 | 11.00 | 1.100 |" in out
    assert "| decode-8 | 2 | 20.00 | 20.00 | 1.000 |" in out
    # sqrt(1.1 * 1.0); the interval spans the two rounds' ratios.
    assert "1.049 (geometric mean of 2 rounds; 95% interval 1.000-1.100)" in out
