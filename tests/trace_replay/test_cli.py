"""CLI smoke tests: simulate on two Weka files (shipped samples), synth, plot."""

import json
from pathlib import Path

import pytest

from trace_replay.cli import main

from trace_replay.samples import SAMPLES

FILES = [SAMPLES / "weka" / "trace_0288.json", SAMPLES / "weka" / "trace_0504.json"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out.json"
    rc = main(["simulate", *map(str, FILES), "--format", "weka", "--policies",
               "histate,vllm-marconi,unlimited", "--json", str(out), "--no-progress",
               "--jobs", "1"])
    assert rc == 0
    return out, json.loads(out.read_text())


def test_simulate_writes_the_required_fields(report):
    _, rep = report
    assert rep["policies"] == ["histate", "vllm-marconi", "unlimited"]
    for name in rep["policies"]:
        m = rep[name]
        for key in ("ttft_p50", "ttft_p95", "ttft_p99", "hit_rate", "recovery"):
            assert key in m, (name, key)
        assert 0 < m["ttft_p50"] <= m["ttft_p95"] <= m["ttft_p99"]
        assert 0 <= m["hit_rate"] <= 1
    s = rep["settings"]
    for key in ("model", "device", "gpu_bytes", "dram_bytes", "ssd_bytes", "block_tokens",
                "concurrency", "seed", "ramp", "command"):
        assert key in s
    assert rep["unlimited"]["hit_rate"] >= rep["histate"]["hit_rate"]
    assert rep["references"] == ["vllm-disk"]  # run to define the reuse-sensitive set
    assert rep["workload"]["requests"] == len(rep["per_request"]["input_tokens"])
    for name in rep["policies"]:  # per request: what its restore read from SSD, its arrival
        assert len(rep["per_request"]["ssd_mb"][name]) == rep["workload"]["requests"]
        assert len(rep["per_request"]["arrival"][name]) == rep["workload"]["requests"]


def test_plot_draws_from_the_report(report, tmp_path):
    path, _ = report
    assert main(["plot", str(path), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "fig8_tail_speedup.png").stat().st_size > 0


def test_synth_then_simulate_the_saved_workload(tmp_path, capsys):
    wl = tmp_path / "mb.workload"
    assert main(["synth", "mutation:p=0.5,n_sessions=2,turns=3,new_tokens=2048",
                 "--out", str(wl)]) == 0
    out = tmp_path / "mb.json"
    assert main(["simulate", str(wl), "--policies", "vllm-disk,histate", "--json", str(out),
                 "--no-progress", "--jobs", "1"]) == 0
    rep = json.loads(out.read_text())
    assert rep["workload"]["name"] == "mutation-p0.5"
    assert rep["settings"]["ramp"] == 0.0  # synthetic workloads stagger themselves
    assert "vllm-disk" in capsys.readouterr().out


def test_simulate_rejects_unknown_policies():
    with pytest.raises(SystemExit):
        main(["simulate", "--synth", "append", "--policies", "histate,magic"])


def test_histate_options_keep_integer_counts(tmp_path):
    """--histate-option max_intermediate=0 reaches the planner as the int it must be (a
    float there raised a TypeError deep in a worker process)."""
    out = tmp_path / "opt.json"
    assert main(["simulate", "--synth", "mutation:p=0.5,n_sessions=2,turns=3,new_tokens=2048",
                 "--policies", "histate", "--histate-option", "max_intermediate=0",
                 "--histate-option", "tau=300", "--json", str(out), "--no-progress",
                 "--jobs", "1"]) == 0
    opts = json.loads(out.read_text())["settings"]["core_options"]
    assert opts == {"max_intermediate": 0, "tau": 300}
    assert isinstance(opts["max_intermediate"], int)


@pytest.mark.parametrize("option, named", [
    ("tau=-5", "tau must be seconds > 0"),
    ("terminal_reuse=1.5", "terminal_reuse must be a probability"),
    ("keep_backups=maybe", "keep_backups must be true or false"),
    ("max_intermediate=2.5", "max_intermediate must be an int"),
    ("bogus=1", "unknown option 'bogus'"),
    ("tau", "wants KEY=VALUE"),
])
def test_bad_histate_options_are_named_before_any_run(option, named):
    with pytest.raises(SystemExit, match=named):
        main(["simulate", "--synth", "append", "--policies", "histate",
              "--histate-option", option, "--no-progress", "--jobs", "1"])
