"""summarize_dram: the raw replay at each DRAM size, every order pooled."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from summarize_dram import POLICIES, table  # noqa: E402


def _report(ttft: dict[str, list[float]], read_gb: float, recovery: float) -> dict:
    return {"per_request": {"ttft": ttft, "class": ["append", "cold"]},
            "histate": {"restored_ssd_gb": read_gb, "recovery": recovery},
            "histate-oracle": {"recovery": 1.0}}


def test_orders_pooled_per_size(tmp_path):
    base = {p: [1.0, 3.0] for p in (*POLICIES, "unlimited")}
    for gib, s, hi in ((96, 0, [2.0, 4.0]), (96, 1, [1.0, 5.0]), (192, 0, [1.0, 3.0])):
        rep = _report({**base, "histate": hi}, read_gb=10.0 * (s + 1), recovery=0.5)
        (tmp_path / f"dram-{gib}-s{s}.json").write_text(json.dumps(rep))
    rows = [line for line in table(tmp_path).splitlines() if line[2:3].isdigit()]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    # 96 GiB: HiState's 4 requests average 3.0 s against Unlimited's 2.0 s; appends 1.5 s.
    assert cells[0][:3] == ["96", "2", "3.0000 (+50.0%)"]
    assert cells[0][6] == "2.0000 (+0.0%)"  # the oracle
    assert cells[0][7:] == ["1.500 / 1.000", "15", "50.0% (100.0%)"]
    assert cells[1][:3] == ["192", "1", "2.0000 (+0.0%)"]


def test_an_empty_folder_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no dram-GGG-sS.json"):
        table(tmp_path)
