"""The benchmarks' --report/--into: each writes its tables from a run's saved summary JSON
into the named generated block of a results file, and leaves the prose around it alone.
Tiny synthetic summaries; no engine, no disk measurement."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(name: str):
    # As in test_demo_turns_split: a benchmark puts the checkout first on sys.path (as a
    # script); restore it after the import.
    saved = list(sys.path)
    sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "examples")]
    try:
        return pytest.importorskip(name)
    finally:
        sys.path[:] = saved


def _has_block(results: str, block: str) -> None:
    """The results file carries the block its benchmark writes, once."""
    text = (REPO / "benchmarks" / results).read_text()
    assert text.count(f"<!-- generated: {block} -->\n") == 1, (results, block)


def _results(tmp_path: Path, block: str) -> Path:
    md = tmp_path / "results.md"
    md.write_text(f"# Title\n\nProse before.\n\n<!-- generated: {block} -->\nold table\n"
                  "<!-- /generated -->\n\nProse after.\n")
    return md


def _report(monkeypatch, tmp_path: Path, module, block: str, summaries: list[dict],
            call=None) -> str:
    """Run the benchmark's --report ... --into on saved summaries; the block's new body."""
    paths = []
    for i, s in enumerate(summaries):
        paths.append(tmp_path / f"summary-{i}.json")
        paths[-1].write_text(json.dumps(s))
    md = _results(tmp_path, block)
    argv = ["--report", *map(str, paths), "--into", str(md)]
    if call is None:
        monkeypatch.setattr(sys, "argv", ["bench", *argv])
        module.main()
    else:
        call(argv)
    text = md.read_text()
    assert text.startswith("# Title\n\nProse before.\n\n")
    assert text.endswith("<!-- /generated -->\n\nProse after.\n")
    assert "old table" not in text
    return text.split(f"<!-- generated: {block} -->\n", 1)[1].split("<!-- /generated -->")[0]


def _rec(phase, kind, rnd, total, sched=0.001):
    return dict(phase=phase, kind=kind, running=1, total=total, scheduler=sched,
                worker=total - sched, round=rnd)


def test_step(monkeypatch, tmp_path):
    runs = {"vllm": [_rec("decode-8", "decode", r, 0.010) for r in (0, 1)]
            + [_rec("reload-8", "wall", r, 1.0, 0.0) for r in (0, 1)],
            "histate": [_rec("decode-8", "decode", r, 0.011, 0.0012) for r in (0, 1)]
            + [_rec("reload-8", "wall", r, 0.4, 0.0) for r in (0, 1)]}
    settings = dict(running="8", decode_tokens=96, rounds=2, gpu_blocks=64, block_size=384,
                    dram_mib=256, ssd=False, profile=False, block=384, cpus=2, cpu="Test CPU")
    _has_block("results_step.md", "step")
    body = _report(monkeypatch, tmp_path, _bench("bench_step"), "step",
                   [dict(settings=settings, runs=runs)])
    assert body.startswith("384-token blocks, 64 GPU blocks, decode phases of 8 requests")
    assert "2 CPUs (Test CPU)" in body
    assert "| decode-8 | decode | 2 / 2 | 10.00 | 11.00 | 1.100 | 1.00 / 1.20 | " in body
    assert "| reload-8 | whole phase | 2 / 2 | 1000.00 | 400.00 | 0.400 | - / - | - / - |" in body
    assert "| decode-8 | 2 | 10.00 | 11.00 | 1.100 |" in body
    assert "decode-8: decode step HiState / vLLM alone 1.100 (geometric mean of 2 rounds" in body


def test_chunk_ends_block_is_named_by_the_state_dtype(monkeypatch, tmp_path):
    summary = dict(tokens=32768, prompts=3, ssm_dtype="bfloat16", block=256, cpus=2,
                   cpu="Test CPU", engines={
                       "vllm": dict(ttft=[16.0, 15.0, 17.0], captures=0.0),
                       "terminal": dict(ttft=[8.0, 8.2, 7.9], captures=1.0),
                       "histate": dict(ttft=[8.4, 8.1, 8.3], captures=5.0)})
    _has_block("results_chunk_ends.md", "chunk-ends-float32")
    _has_block("results_chunk_ends.md", "chunk-ends-bfloat16")
    body = _report(monkeypatch, tmp_path, _bench("bench_chunk_ends"), "chunk-ends-bfloat16",
                   [summary])
    assert "3 fresh prompts of 32,768 tokens per engine, bfloat16 states (256-token blocks)" in body
    assert "| vllm | 0.0 | 16.000 | 2,048 | 0.500 |" in body
    assert "| terminal | 1.0 | 8.000 | 4,096 | 1.000 |" in body
    assert "| histate | 5.0 | 8.300 | 3,948 | 0.964 |" in body
    assert "+0.300 s (+3.8%) for 4.0 more checkpoints" in body


def test_fleet(monkeypatch, tmp_path):
    pol = dict(completed=10, failed=0, hit_rate=0.5, reusable_rate=0.7, ttft_mean=3.0,
               ttft_p50=2.0, ttft_p99=9.0, warm_requests=6, ttft_mean_warm=2.5,
               ttft_mean_cold=3.75, split=[6, 4])
    settings = dict(users=4, sessions=34, traces=["weka"], max_delay=20.0, time_scale=0.1,
                    max_context=24000, max_output_tokens=16, duration=120.0, gpu_blocks=160,
                    block=256, dram_mib=64, ssd_mib=1024, cpus=2, cpu="Test CPU")
    _has_block("results_fleet.md", "fleet")
    body = _report(monkeypatch, tmp_path, _bench("bench_fleet"), "fleet",
                   [dict(settings=settings, policies={"consistent_hash": pol,
                                                      "round_robin": dict(pol, split=[5, 5])})])
    assert body.startswith("4 users, 34 sessions from weka;")
    assert ("| consistent_hash | 10 | 0 | 0.500 | 0.700 | 3.00 | 2.00 | 9.00 | 6 | 2.50 | "
            "3.75 | 6 / 4 |") in body
    assert "| round_robin |" in body and "| 5 / 5 |" in body


def test_store_one_row_per_run(monkeypatch, tmp_path):
    MiB = 1 << 20

    def run(threads, ahead, store_w, store_r):
        return dict(settings=dict(context_tokens=32768, states=4, state_mib=64, raw_mib=512,
                                  rounds=2, io_threads=threads, read_ahead=ahead,
                                  buffered=False, unaligned=False),
                    round_mib=1030.0, chunks=86, chunk_mib=9.0, context_chunks=86,
                    cpus=2, cpu="Test CPU", enqueue_us=[10.0] * 98 + [100.0, 900.0],
                    rounds=dict(direct_write=[2000 * MiB] * 2,
                                buffered_fsync_write=[1000 * MiB] * 2,
                                direct_read=[1000 * MiB] * 2, buffered_read=[2000 * MiB] * 2,
                                store_write=[store_w * MiB] * 2,
                                store_read=[store_r * MiB] * 2, context_s=[0.5, 0.7],
                                scan_s=[0.001] * 2))

    _has_block("results_store.md", "store")
    body = _report(monkeypatch, tmp_path, _bench("bench_store"), "store",
                   [run(4, 4, 1600, 1000), run(1, 1, 1000, 500)])
    assert body.startswith("One 32,768-token context a round: 86 KV chunk files of 9.0 MiB")
    assert ("| 4 writer threads, 4 reads in flight | 2 | 2,000 | 1,600 | 80% | 80% | 2,000 "
            "| 1,000 | 50% | 50% | 0.60 s | 10 / 900 / 900 us |") in body
    assert "| 1 writer thread, 1 read in flight | 2 | 2,000 | 1,000 | 50% |" in body


def test_weights_digest(monkeypatch, tmp_path):
    _has_block("results_weights_digest.md", "weights-digest")
    mod = _bench("bench_weights_digest")
    summary = dict(bytes=4 << 30, cold=True, threads=2, files_at_once=4, hash_gbps_1=14.0,
                   hash_gbps_n=28.0, first_s=2.0, restart_s=0.002, restart_bytes=0, cpus=2,
                   cpu="Test CPU")
    body = _report(monkeypatch, tmp_path, mod, "weights-digest", [summary], call=mod.main)
    assert "| first start: read and hash (4.3 GB) | 2.00 s (2.15 GB/s) |" in body
    assert "| restart, weights unchanged (cached digest) | 2.00 ms (0 bytes read) |" in body
    assert "| this drive (2.15 GB/s) | 9.3 s | 93.1 s |" in body
    assert "| NVMe PCIe 4 (7 GB/s) | 2.9 s | 28.6 s |" in body


def test_a_missing_block_writes_nothing(tmp_path):
    blocks = _bench("results_blocks")
    md = _results(tmp_path, "other")
    before = md.read_text()
    with pytest.raises(SystemExit, match="no block"):
        blocks.write_into(md, {"step": "table"})
    assert md.read_text() == before
