"""Loaders on real traces and on malformed files.

The real traces are the samples shipped in trace_replay/samples (every format, so these run
on a fresh clone), or a full set named by $HISTATE_TRACES (for example ../shared/traces).
"""

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from trace_replay import TraceFormatError, check_chained, detect_format, load
from trace_replay.loaders import load_mooncake, load_tracelab_csv, load_tracelab_rounds, load_weka

from trace_replay.samples import SAMPLES

TRACES = Path(os.environ.get("HISTATE_TRACES") or SAMPLES)


def _dir(name: str) -> Path:
    d = TRACES / name
    assert d.is_dir(), f"trace directory {d} absent"
    return d


def _lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def _common(a, b) -> int:
    m = min(len(a), len(b))
    d = np.flatnonzero(np.asarray(a[:m]) != np.asarray(b[:m]))
    return int(d[0]) if len(d) else m


@pytest.fixture(scope="module")
def weka():
    d = _dir("weka")
    t0 = time.perf_counter()
    wl = load(d)
    elapsed = time.perf_counter() - t0
    print(f"\nloaded {len(list(d.glob('*.json')))} Weka files in {elapsed:.2f} s")
    return d, wl, elapsed


# ---------------------------------------------------------------- format detection


def test_detect_format_on_every_real_file():
    want = {"weka": "weka", "mooncake": "mooncake"}
    for sub in ("weka", "tracelab", "mooncake"):
        for f in sorted(_dir(sub).iterdir()):
            if f.suffix == ".json" or f.suffix == ".jsonl":
                expected = want.get(sub, "tracelab")
            elif f.suffix == ".csv":
                expected = "tracelab_csv"
            else:
                with pytest.raises(TraceFormatError, match="no known trace format"):
                    detect_format(f)
                continue
            assert detect_format(f) == expected, f


# ---------------------------------------------------------------- Weka


def test_weka_loads_fast_and_completely(weka):
    d, wl, elapsed = weka
    files = sorted(d.glob("*.json"))
    assert files
    mains = [s for s in wl.sessions if s.kind == "main"]
    assert len(mains) == len(files) and wl.block_size == 64
    raw_requests = 0
    for f in files:

        def count(entries):
            return sum(count(e["requests"]) if e["type"] == "subagent" else 1 for e in entries)

        raw_requests += count(json.loads(f.read_bytes())["requests"])
    assert wl.n_requests == raw_requests
    for s in wl.sessions:
        for r in s.requests:
            assert len(r.block_hashes) == r.input_tokens // 64


def test_weka_chaining_matches_local_ids(weka):
    """Chained ids agree with the file's local ids wherever the file's own promise holds,
    and are prefix-consistent across all files (no cross-file collisions)."""
    d, wl, _ = weka
    check_chained(wl)
    for f in sorted(d.glob("*.json"))[:12]:
        raw = json.loads(f.read_bytes())
        local = [e["hash_ids"][: e["in"] // 64] for e in raw["requests"] if e["type"] != "subagent"]
        ours = [r.block_hashes for r in wl.session(raw["id"]).requests]
        for i in range(1, len(local)):
            assert _common(ours[i], ours[i - 1]) == _common(local[i], local[i - 1])
    per_file = [
        set(
            np.concatenate(
                [
                    r.block_hashes
                    for s in wl.sessions
                    if s.id.split("/")[0] == m.id
                    for r in s.requests
                ]
            ).tolist()
        )
        for m in wl.sessions
        if m.kind == "main"
    ]
    assert sum(map(len, per_file)) == len(set().union(*per_file))


def test_weka_subagents_are_concurrent_sessions_in_parent_namespace(weka):
    _, wl, _ = weka
    subs = [s for s in wl.sessions if s.kind == "subagent"]
    assert [s.id for s in subs] == [f"trace_0276/agent_00{i}" for i in range(1, 5)]
    parent = wl.session("trace_0276")
    raw = json.loads((_dir("weka") / "trace_0276.json").read_bytes())
    starts = [e["t"] for e in raw["requests"] if e["type"] == "subagent"]
    for s, t in zip(subs, starts):
        assert s.parent == "trace_0276" and s.start == parent.start + t
        assert all(r.kind == "subagent" and r.agent_id == s.agent_id for r in s.requests)
    # Subagents share their system prompt with each other (same local ids, same namespace)...
    assert _common(subs[0].requests[0].block_hashes, subs[1].requests[0].block_hashes) > 100
    # ...and the parent keeps sending while agent_003 runs: they really are concurrent.
    a3 = subs[2]
    end3 = a3.start + a3.requests[-1].t
    assert any(a3.start < parent.start + r.t < end3 for r in parent.requests)


def test_weka_main_prompts_carry_where_their_system_prompt_and_tools_end(weka):
    _, wl, _ = weka
    raw = json.loads((_dir("weka") / "trace_0276.json").read_bytes())
    end = raw["system_tokens"] + raw["tool_tokens"]
    assert end > 0
    assert all(r.message_end == end for r in wl.session("trace_0276").requests)
    # The client's breakpoints: the tools' end (they come first), then the system prompt's.
    marks = (raw["tool_tokens"], end)
    assert all(r.breakpoints == marks for r in wl.session("trace_0276").requests)
    subs = [s for s in wl.sessions if s.kind == "subagent"]
    assert subs and all(r.message_end == 0 and r.breakpoints == () for s in subs
                        for r in s.requests)


def test_weka_prompt_extension_rate(weka):
    """README: 93% of requests extend the previous prompt exactly (full set); report ours."""
    _, wl, _ = weka
    ext = total = 0
    for s in wl.sessions:
        for a, b in zip(s.requests, s.requests[1:]):
            total += 1
            ext += _common(a.block_hashes, b.block_hashes) == len(a.block_hashes)
    print(
        f"\nWeka sample: {ext}/{total} = {ext / total:.1%} of requests extend the previous prompt"
    )
    assert ext / total > 0.8


def test_weka_coarsening_on_load(weka):
    d, wl, _ = weka
    coarse = load(d / "trace_0012.json", block_size=576)
    fine = wl.session("trace_0012")
    assert coarse.block_size == 576
    for rc, rf in zip(coarse.sessions[0].requests, fine.requests):
        assert np.array_equal(rc.block_hashes, rf.block_hashes[8::9])
    with pytest.raises(ValueError, match="not a multiple"):
        load(d / "trace_0012.json", block_size=100)


# ---------------------------------------------------------------- TraceLab


def test_tracelab_rounds_prefix_synthesis():
    d = _dir("tracelab")
    files = sorted(d.glob("*round_trace.jsonl"))
    wl = load_tracelab_rounds(files)
    assert len(wl.sessions) == 4 and wl.arrivals == "recorded"
    check_chained(wl)
    for f in files:
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        for s in (s for s in wl.sessions if s.source == str(f)):
            sid = s.id.split("/", 1)[1]
            mine = sorted(
                (r for r in rows if r["session_id"] == sid), key=lambda r: r["round_index"]
            )
            assert [r.input_tokens for r in s.requests] == [r["input_tokens_total"] for r in mine]
            for i in range(1, len(mine)):
                prev, cur = s.requests[i - 1].block_hashes, s.requests[i].block_hashes
                want = min(mine[i]["prefix_tokens"] // 64, len(prev))
                assert _common(prev, cur) == want
    codex = load_tracelab_rounds(files, providers=["codex"])
    assert len(codex.sessions) == 2
    r3 = codex.sessions[0].requests[3]  # provider cache miss: prefix 3456 of 10058 tokens
    assert _common(codex.sessions[0].requests[2].block_hashes, r3.block_hashes) == 3456 // 64
    claude = load_tracelab_rounds(files[:1], providers=["claude"]).sessions[0]
    assert claude.requests[1].think_time == pytest.approx(19.291)  # WebSearch tool latency


def test_tracelab_csv_with_and_without_arrival_time():
    d = _dir("tracelab")
    multi = load_tracelab_csv(d / "replay_examples_multi_session_example.csv")
    assert [s.start for s in multi.sessions] == [0.0, 0.2, 0.5]
    s0 = multi.sessions[0]
    assert [r.input_tokens for r in s0.requests] == [512, 704, 896]
    assert [r.think_time for r in s0.requests] == [0.0, 0.1, 0.1]
    assert _common(s0.requests[0].block_hashes, s0.requests[1].block_hashes) == 8
    single = load_tracelab_csv(d / "replay_examples_session_workload_example.csv")
    reqs = single.sessions[0].requests
    assert single.sessions[0].start == 0.0 and single.arrivals == "synthetic"
    # Round 10 goes back to round 3's prefix (48060 tokens): an internal hit.
    assert _common(reqs[9].block_hashes, reqs[10].block_hashes) == 48060 // 64
    large = load(d / "replay_examples_multi_session_large.csv")
    assert len(large.sessions) == 48 and large.n_requests == 303
    check_chained(load(d))  # the whole folder, rounds + CSVs mixed


# ---------------------------------------------------------------- Mooncake


def test_mooncake_sessions_follow_prefix_chains():
    d = _dir("mooncake")
    t0 = time.perf_counter()
    wl = load(d)
    print(
        f"\nMooncake: {wl.n_requests} requests -> {len(wl.sessions)} sessions "
        f"in {time.perf_counter() - t0:.2f} s"
    )
    assert wl.block_size == 512
    assert wl.n_requests == sum(_lines(f) for f in d.glob("*.jsonl"))
    check_chained(wl)
    for s in wl.sessions:
        for i, r in enumerate(s.requests):
            assert len(r.block_hashes) == r.input_tokens // 512
            if i:  # some earlier prompt of the session (>= 2 blocks) is a prefix of this one
                assert any(
                    len(q.block_hashes) >= 2
                    and _common(q.block_hashes, r.block_hashes) == len(q.block_hashes)
                    for q in s.requests[:i]
                )


def test_mooncake_session_rule(tmp_path):
    rows = [
        (0, 1100, [0, 1, 2]),  # new session; full blocks [0, 1]
        (10, 2048, [0, 1, 3, 4]),  # extends [0, 1] -> same session
        (20, 1500, [0, 5, 6]),  # shares only block 0 -> new session
        (30, 600, [0, 7]),  # one full block: new session, too short to be joined
        (40, 1024, [0, 8]),  # shares only block 0 with the previous -> new session
        (50, 3000, [0, 1, 3, 4, 9, 10]),  # extends request 2 -> first session
    ]
    f = tmp_path / "mc.jsonl"
    f.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 1, "hash_ids": h})
            + "\n"
            for t, n, h in rows
        )
    )
    wl = load_mooncake(f)
    assert [len(s.requests) for s in wl.sessions] == [3, 1, 1, 1]
    first = wl.sessions[0]
    assert [r.t for r in first.requests] == [0.0, 0.01, 0.05]
    assert [r.think_time for r in first.requests] == [0.0, 0.01, 0.04]
    assert [len(s.requests) for s in load_mooncake(f, min_match_blocks=1).sessions] == [3, 1, 2]


def test_mixing_block_sizes_needs_a_common_block_size():
    w, m = _dir("weka") / "trace_0012.json", _dir("mooncake") / "synthetic_trace.jsonl"
    with pytest.raises(ValueError, match="block sizes"):
        load([w, m])
    both = load([w, m], block_size=512)
    assert both.block_size == 512 and len(both.sessions) > 1


# ---------------------------------------------------------------- malformed input

_WEKA_OK = {
    "id": "x",
    "block_size": 64,
    "requests": [
        {"t": 0.0, "type": "n", "in": 130, "out": 5, "hash_ids": [1, 2], "think_time": 0.0}
    ],
}


def _write(tmp_path, name, obj) -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda d: d["requests"][0].pop("in"), r"missing required field `in`.*\$\.requests\[0\]"),
        (
            lambda d: d["requests"][0].update({"out": "five"}),
            r"Expected `int`.*\$\.requests\[0\]\.out",
        ),
        (
            lambda d: d["requests"][0].update({"type": "zz"}),
            r"Invalid value 'zz'.*\$\.requests\[0\]\.type",
        ),
        (
            lambda d: d["requests"][0].update({"hash_ids": [1]}),
            r"\$\.requests\[0\]\.hash_ids has 1 ids for in=130",
        ),
        (
            lambda d: d["requests"][0].update({"hash_ids": [1, -2]}),
            r"\$\.requests\[0\]\.hash_ids\[1\]",
        ),
        (lambda d: d.pop("requests"), r"missing required field `requests`"),
    ],
)
def test_weka_malformed(tmp_path, mutate, pattern):
    d = json.loads(json.dumps(_WEKA_OK))
    mutate(d)
    p = _write(tmp_path, "bad.json", d)
    with pytest.raises(TraceFormatError, match=pattern) as e:
        load_weka(p)
    assert "bad.json" in str(e.value)


def test_weka_accepts_readme_ceil_convention_and_rejects_duplicates(tmp_path):
    d = json.loads(json.dumps(_WEKA_OK))
    d["requests"][0]["hash_ids"] = [1, 2, 3]  # ceil(130 / 64): partial block id dropped
    a = _write(tmp_path, "a.json", d)
    assert len(load(a).sessions[0].requests[0].block_hashes) == 2
    shutil.copy(a, tmp_path / "b.json")  # same session id twice
    with pytest.raises(ValueError, match="duplicate session id 'x'"):
        load(tmp_path)


def test_invalid_json_names_file(tmp_path):
    p = _write(tmp_path, "broken.json", '{"id": "x", "block_size": 64, "requests": [')
    with pytest.raises(TraceFormatError, match="broken.json.*malformed|broken.json.*truncated"):
        load(p, "weka")


def test_jsonl_errors_name_the_line(tmp_path):
    good = {"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1, 2]}
    p = _write(
        tmp_path, "mc.jsonl", json.dumps(good) + "\n" + json.dumps({**good, "hash_ids": [0]}) + "\n"
    )
    with pytest.raises(TraceFormatError, match=r"mc.jsonl:2: 1 hash_ids for input_length 1100"):
        load(p)
    p = _write(tmp_path, "mc.jsonl", json.dumps(good) + "\n" + json.dumps({"timestamp": 1}) + "\n")
    with pytest.raises(
        TraceFormatError, match=r"mc.jsonl:2: .*missing required field `input_length`"
    ):
        load(p, "mooncake")
    row = {
        "session_id": "s",
        "round_index": 0,
        "input_tokens_total": 100,
        "prefix_tokens": 10,
        "newly_append_tokens": 80,
        "output_tokens": 5,
    }
    p = _write(tmp_path, "tl.jsonl", json.dumps(row) + "\n")
    with pytest.raises(TraceFormatError, match=r"tl.jsonl:1: prefix_tokens \+ newly_append_tokens"):
        load(p)


@pytest.mark.parametrize(
    "text, pattern",
    [
        (
            "session_id,round_idx,prefix_len,input_len,output_len\n0,0,0,10,1\n",
            r"bad.csv:1: missing column\(s\) \['tool_wait_after_ms'\]",
        ),
        (
            "session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n0,0,0,ten,1,0\n",
            r"bad.csv:2: field 'input_len': expected int, got 'ten'",
        ),
        (
            "session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n0,0,0,10,1,0\n0,1,5\n",
            r"bad.csv:3: expected 6 fields",
        ),
        (
            "session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n0,0,0,10,1,0\n0,0,0,10,1,0\n",
            r"bad.csv:3: duplicate round_idx 0",
        ),
    ],
)
def test_csv_malformed(tmp_path, text, pattern):
    p = _write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceFormatError, match=pattern):
        load_tracelab_csv(p)


def test_unknown_format_and_missing_path(tmp_path):
    p = _write(tmp_path, "x.json", {"hello": 1})
    with pytest.raises(TraceFormatError, match="no known trace format"):
        load(p)
    with pytest.raises(ValueError, match="unknown trace format"):
        load(p, "nope")
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.json")
