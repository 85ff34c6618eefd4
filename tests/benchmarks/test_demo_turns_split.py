"""benchmarks/bench_demo_turns.py's split of a turn's TTFT by the worker's steps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The benchmark puts the checkout first on sys.path (as a script); restore it after, so
# this test process never finds the repo's triton_kernels folder as a module.
_saved = list(sys.path)
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "examples")]
try:
    split_turn = pytest.importorskip("bench_demo_turns").split_turn
finally:
    sys.path[:] = _saved


def test_a_restore_waits_then_prefills():
    # [start s after arrival, duration s, tokens]: the load's empty step, two prefill
    # steps, then decode steps (after the first token: not counted).
    steps = [[0.001, 0.003, 0], [0.006, 0.050, 384], [0.058, 0.100, 768],
             [0.160, 0.006, 1]]
    got = split_turn(dict(ttft=0.162, steps=steps))
    assert got["wait"] == pytest.approx(0.006)
    assert got["compute"] == pytest.approx(0.150)
    assert got["between"] == pytest.approx(0.006)
    assert got["steps"] == 2
    assert got["wait"] + got["compute"] + got["between"] == pytest.approx(got["ttft"])


def test_a_cold_turn_starts_at_once():
    got = split_turn(dict(ttft=0.3, steps=[[0.0005, 0.29, 1920], [0.295, 0.005, 1]]))
    assert got["wait"] == pytest.approx(0.0005)
    assert got["compute"] == pytest.approx(0.29)
