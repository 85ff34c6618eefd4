"""Live replay pieces that need no server: token-id prompts and the loopback guard."""

import http.server
import itertools
import json
import threading
import time

import msgspec
import pytest

from trace_replay import synth
from trace_replay.live import (
    LiveConfig,
    _gap,
    _session_order,
    check_loopback,
    prompt_tokens,
    replay_live,
)

SHAPE = synth.Shape(n_sessions=2, turns=3, system_tokens=1024, new_tokens=1000,
                    output_tokens=8, jitter=0.0, stagger=False)


def test_shared_blocks_give_identical_tokens():
    wl = synth.append_pattern(SHAPE)
    cfg = LiveConfig(vocab=2000)
    a0, a1 = wl.sessions[0].requests[:2]
    b0 = wl.sessions[1].requests[0]
    t_a0, t_a1, t_b0 = (prompt_tokens(r, wl.block_size, cfg) for r in (a0, a1, b0))
    assert len(t_a0) == a0.input_tokens
    full = a0.input_tokens // wl.block_size * wl.block_size
    assert t_a1[:full] == t_a0[:full]  # the next turn extends the previous prompt
    assert t_b0[:1024] == t_a0[:1024]  # the shared system prompt
    assert t_b0[1024:1088] != t_a0[1024:1088]
    assert all(2 <= t < 2000 for t in t_a1)
    assert prompt_tokens(a1, wl.block_size, cfg) == t_a1  # deterministic


def test_prompts_are_cut_to_a_prefix():
    wl = synth.append_pattern(SHAPE)
    r = wl.sessions[0].requests[2]
    long = prompt_tokens(r, wl.block_size, LiveConfig())
    short = prompt_tokens(r, wl.block_size, LiveConfig(max_input_tokens=1500))
    assert short == long[:1500]


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:9"])
def test_loopback_urls_pass(url):
    check_loopback(url)


@pytest.mark.parametrize("url", ["http://example.com:8000", "http://10.0.0.5:8000",
                                 "http://0.0.0.0:8000"])
def test_other_urls_are_refused(url):
    with pytest.raises(ValueError, match="loopback"):
        check_loopback(url)
    with pytest.raises(ValueError, match="loopback"):
        replay_live(synth.append_pattern(SHAPE), LiveConfig(url=url))


def test_warm_prefix_is_shared_and_salt_makes_a_new_conversation():
    wl = synth.append_pattern(SHAPE)
    cfg = LiveConfig(warm_prefix_tokens=300, max_input_tokens=100_000)
    a0, b0 = wl.sessions[0].requests[0], wl.sessions[1].requests[0]
    t_a0, t_b0 = (prompt_tokens(r, wl.block_size, cfg) for r in (a0, b0))
    assert len(t_a0) == a0.input_tokens + 300
    assert t_a0[:300] == t_b0[:300]
    plain = prompt_tokens(a0, wl.block_size, LiveConfig(max_input_tokens=100_000))
    assert t_a0[300:] == plain  # the trace's own tokens follow the warm prefix unchanged
    salted = prompt_tokens(a0, wl.block_size, cfg, salt=1)
    assert salted[:300] == t_a0[:300] and salted[300:364] != t_a0[300:364]
    a1 = wl.sessions[0].requests[1]
    full = a0.input_tokens // wl.block_size * wl.block_size
    # A salted pass keeps its own prefix sharing: the next turn extends the salted prompt.
    assert prompt_tokens(a1, wl.block_size, cfg, salt=1)[:300 + full] == salted[:300 + full]
    cut = prompt_tokens(a0, wl.block_size, LiveConfig(warm_prefix_tokens=300,
                                                      max_input_tokens=1000))
    assert cut == t_a0[:1000]


def test_gaps_are_capped_then_scaled():
    wl = synth.append_pattern(SHAPE)
    s = wl.sessions[0]
    prev, req = s.requests[0], s.requests[1]
    req = msgspec.structs.replace(req, t=prev.t + 100.0, think_time=7.0)
    assert _gap(LiveConfig(time_scale=0.5), prev, req) == 3.5
    assert _gap(LiveConfig(gap="arrival", time_scale=0.2, max_delay=30.0), prev, req) == 6.0
    with pytest.raises(ValueError):
        LiveConfig(gap="wall")


def test_recycled_users_start_the_workload_again_salted():
    wl = synth.append_pattern(SHAPE)
    ids = [s.id for s in wl.sessions if s.requests]
    once = list(_session_order(wl, LiveConfig()))
    assert [(k, s.id) for k, s in once] == [(0, i) for i in ids]
    again = list(itertools.islice(_session_order(wl, LiveConfig(recycle=True)), 2 * len(ids)))
    assert [(k, s.id) for k, s in again] == [(k, i) for k in (0, 1) for i in ids]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class _Handler(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style completions endpoint that streams one token after a short delay."""

    delay = 0.05

    prompts: list = []
    sessions: list = []  # the X-Session-ID header of each request
    params: list = []  # the kv_transfer_params of each request

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.prompts.append(req["prompt"])
        _Handler.sessions.append(self.headers.get("X-Session-ID"))
        _Handler.params.append(req.get("kv_transfer_params"))
        time.sleep(self.delay)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        usage = {"prompt_tokens": len(req["prompt"]), "completion_tokens": 1,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        for chunk in ({"choices": [{"text": "x"}]}, {"choices": [], "usage": usage}):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


def test_recycled_users_replay_until_the_deadline():
    _Handler.prompts = []
    server = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wl = synth.append_pattern(SHAPE)  # 2 sessions x 3 turns
        cfg = LiveConfig(url=f"http://127.0.0.1:{server.server_address[1]}", concurrency=2,
                         max_requests=10, max_time=60.0, recycle=True, warm_prefix_tokens=50)
        rep = replay_live(wl, cfg)
    finally:
        server.shutdown()
    recs = rep["requests"]
    assert rep["summary"]["completed"] == 10 and rep["summary"]["failed"] == 0
    assert {r["pass"] for r in recs} == {0, 1}  # the workload ran out and started again
    # Every prompt but the first sent shares at least the warm prefix's whole pieces
    # (records are in completion order).
    assert sorted(r["shared_tokens"] for r in recs)[1] >= 48
    assert rep["summary"]["cached_of_reusable"] == 0.0  # the fake server caches nothing
    assert all(p[:50] == _Handler.prompts[0][:50] for p in _Handler.prompts)
    first = {(r["session"], r["index"]): r for r in recs if r["pass"] == 0}
    again = [r for r in recs if r["pass"] == 1]
    assert all(r["input_tokens"] == first[r["session"], r["index"]]["input_tokens"]
               for r in again if (r["session"], r["index"]) in first)


def test_requests_in_flight_at_the_deadline_finish_and_no_more_are_sent():
    _Handler.prompts = []
    _Handler.delay = 1.0  # each request outlives the deadline, on a loaded machine too
    server = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = LiveConfig(url=f"http://127.0.0.1:{server.server_address[1]}", concurrency=2,
                         max_requests=100, max_time=0.5, recycle=True)
        rep = replay_live(synth.append_pattern(SHAPE), cfg)
    finally:
        server.shutdown()
        _Handler.delay = 0.05
    # Each user's first request was sent before the deadline and outlives it (the server
    # takes 1 s): it counts as completed, not as an error.
    assert rep["summary"]["completed"] == len(rep["requests"]) == 2
    assert len(_Handler.prompts) == len(rep["requests"])


def test_decode_stalls_count_only_gaps_every_decoding_request_waited():
    from trace_replay.live import decode_stalls

    recs = [
        # Decodes from 0 to 10 s with a 3-s hole (4 -> 7) that nobody else fills.
        {"ok": True, "token_times": [0.0, 1.0, 2.0, 3.0, 4.0, 7.0, 8.0, 9.0, 10.0]},
        # Starts after the hole: its own first token is no stall (a prefill, not a freeze).
        {"ok": True, "token_times": [20.0, 20.5]},
        # Idle time between requests (10 -> 20) is not a stall either.
        {"ok": False, "error": "x"},
    ]
    got = decode_stalls(recs)
    assert got["stall_max"] == 3.0
    assert got["stalls_over_1s"] == 1
    assert got["itl_max"] == 3.0
    # Another request's tokens inside the hole: the server was not frozen.
    recs.append({"ok": True, "token_times": [4.5, 5.5, 6.5]})
    got = decode_stalls(recs)
    assert got["stall_max"] == 1.0 and got["stalls_over_1s"] == 0
    assert got["itl_max"] == 3.0  # one request still waited that long


def test_a_router_sees_each_session_by_name_and_runs_share_no_prompt():
    """What bench_fleet replays through vllm-router: the session header (its affinity key)
    on every request, and a run salt so two runs on the same engines share nothing."""
    _Handler.prompts, _Handler.sessions = [], []
    server = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    wl = synth.append_pattern(SHAPE)  # 2 sessions x 3 turns
    try:
        cfg = LiveConfig(url=f"http://127.0.0.1:{server.server_address[1]}", concurrency=2,
                         session_header="X-Session-ID", run=3)
        rep = replay_live(wl, cfg)
    finally:
        server.shutdown()
    assert rep["summary"]["completed"] == 6
    names = {s.id: f"3-0-{s.id}" for s in wl.sessions}
    assert sorted(_Handler.sessions) == sorted(names[r["session"]] for r in rep["requests"])
    req = wl.sessions[0].requests[0]
    plain = prompt_tokens(req, wl.block_size, LiveConfig())
    runs = [prompt_tokens(req, wl.block_size, LiveConfig(run=k)) for k in (1, 2)]
    assert len({tuple(plain[:64]), *(tuple(r[:64]) for r in runs)}) == 3
    assert prompt_tokens(req, wl.block_size, LiveConfig(run=0)) == plain


def test_the_client_breakpoints_go_to_the_server_after_the_warm_prefix():
    """The trace's breakpoints (Weka: where the tools and the system prompt end) reach the
    server as kv_transfer_params, shifted past the warm prefix; those past the prompt sent
    are dropped; --breakpoints none sends nothing."""
    import msgspec

    wl = synth.append_pattern(SHAPE)
    first = wl.sessions[0].requests[0]
    marked = msgspec.structs.replace(first, breakpoints=(64, 10**6))
    sessions = (msgspec.structs.replace(wl.sessions[0], requests=(marked,)),)
    wl = msgspec.structs.replace(wl, sessions=sessions)
    server = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for declared, want in ((True, {"histate_breakpoints": [74]}), (False, None)):
            _Handler.params = []
            replay_live(wl, LiveConfig(url=url, warm_prefix_tokens=10, breakpoints=declared))
            assert _Handler.params == [want]
    finally:
        server.shutdown()


def test_shared_prefixes_measure_what_any_cache_could_reuse():
    """The reuse ceiling: the prefix a prompt shares with any prompt sent before it, in
    16-token pieces, then whole server blocks short of the last token."""
    from trace_replay.live import SharedPrefixes, reusable

    sent = SharedPrefixes()
    a = list(range(100, 1100))  # 1000 tokens
    assert sent.add(a) == 0
    assert sent.add(a + [7] * 500) == 992  # an append: all of a's whole pieces
    fork = a[:300] + [9] * 200
    assert sent.add(fork) == 288  # diverges at 300: pieces before it
    assert sent.add([5] * 400) == 0
    assert sent.add(fork) == 496  # itself again: whole
    assert reusable(992, 1500, 384) == 768
    assert reusable(496, 500, 16) == 496 and reusable(500, 500, 16) == 496  # one token left
    assert reusable(288, 500, 384) == 0
    coarse = SharedPrefixes(384)  # the server's block as the grain: whole blocks only
    assert coarse.add(a) == 0 and coarse.add(a + [7] * 500) == 768


def test_the_summary_sets_cached_tokens_against_the_ceiling():
    from trace_replay.live import summarize

    recs = [{"ok": True, "ttft": 1.0, "prompt_tokens": 1000, "cached_tokens": 0,
             "shared_tokens": 0},
            {"ok": True, "ttft": 0.2, "prompt_tokens": 1500, "cached_tokens": 384,
             "shared_tokens": 992},
            {"ok": True, "ttft": 0.8, "prompt_tokens": 500, "cached_tokens": 0,
             "shared_tokens": 288}]
    s = summarize(recs, 384)
    assert s["reusable_tokens"] == 768
    assert s["cached_of_reusable"] == 0.5
    assert (s["warm_requests"], s["cold_requests"]) == (1, 2)
    assert s["ttft_mean_warm"] == 0.2 and s["ttft_mean_cold"] == 0.9
    with pytest.raises(ValueError, match="multiple of 16"):
        LiveConfig(block_tokens=100)


def test_the_live_command_prints_the_ceiling(capsys):
    from trace_replay.cli import main

    _Handler.prompts = []
    server = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rc = main(["live", "--synth", "append:n_sessions=2,turns=3", "--url",
                   f"http://127.0.0.1:{server.server_address[1]}", "--block-tokens", "64",
                   "--max-requests", "6"])
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert rc == 0
    assert "any cache could have served" in out and "cached / reusable 0.0%" in out
