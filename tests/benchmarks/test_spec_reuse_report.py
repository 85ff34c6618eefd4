"""benchmarks/bench_spec_reuse.py --report/--into: a table per block size from a saved
summary, reused tokens per system and drafter, and where HiState's greedy tokens differ."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_report_writes_one_table_per_block_size(tmp_path, monkeypatch):
    saved = list(sys.path)
    sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "examples")]
    try:
        bench = pytest.importorskip("bench_spec_reuse")
    finally:
        sys.path[:] = saved
    runs = []
    for states, bs in (("float32", 384), ("bfloat16", 256)):
        for drafts in ("none", "ngram", "mtp"):
            for system in ("vllm", "histate"):
                hit = {"vllm": bs, "histate": 2 * bs}[system]
                tokens = [1, 2] if (system, drafts, states) != ("histate", "mtp", "bfloat16") \
                    else [1, 3]
                runs.append(dict(states=states, drafts=drafts, system=system, block_size=bs,
                                 cached={"task": 0, "edit": hit},
                                 tokens={"task": [1, 2], "edit": tokens}))
    summary = dict(cpu="Test CPU", turns=["task", "edit"],
                   prompt_tokens={"task": 3000, "edit": 3100}, runs=runs)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    md = tmp_path / "results.md"
    md.write_text("# T\n\n<!-- generated: spec-reuse -->\nold\n<!-- /generated -->\n\nafter\n")
    monkeypatch.setattr(sys, "argv", ["bench", "--report", str(path), "--into", str(md)])
    bench.main()
    text = md.read_text()
    assert "old" not in text and text.endswith("<!-- /generated -->\n\nafter\n")
    assert "float32 states, 384-token blocks:" in text and "bfloat16 states, 256-token" in text
    assert "| edit | 3,100 | 384 | 384 | 384 | 768 | 768 | 768 | all |" in text
    assert "| edit | 3,100 | 256 | 256 | 256 | 512 | 512 | 512 | none, ngram |" in text


def test_the_results_file_has_the_block():
    text = (REPO / "benchmarks" / "results_speculative.md").read_text()
    assert text.count("<!-- generated: spec-reuse -->\n") == 1
