"""dead_data: where each block a session writes is last read."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace_replay"))

from _sim_helpers import BS, SessionBuilder, workload  # noqa: E402
from dead_data import shares  # noqa: E402


def test_an_edit_replaces_the_tail_and_the_last_prompt_ends_the_session():
    # 3,000 tokens (46 blocks), then an edit at 1,024 (16 kept) and 276 new: 20 blocks.
    wl = workload(SessionBuilder("A").turn(3000).turn(276, cut=16 * BS))
    got = shares(wl)
    assert got["blocks"] == 46 + 4
    assert got["last read by the session's final request"] == 20 / 50
    assert got["last read before it (replaced)"] == 30 / 50
    assert got["replaced at or inside the first message"] == 0.0


def test_a_compaction_replaces_everything_at_the_start():
    wl = workload(SessionBuilder("A").turn(3000).turn(1000, cut=0))
    got = shares(wl)
    assert got["last read before it (replaced)"] == 46 / (46 + 15)
    assert got["replaced at or inside the first message"] == 1.0
