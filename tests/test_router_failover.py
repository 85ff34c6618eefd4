"""The router settings docs/fleet.md gives for a fleet whose engines can die ("When an engine
dies"), checked against vllm-router itself with stub workers (the `router` extra).

A request sent after an engine died but before a health check noticed is retried by the
router on that same engine; with its default retries (5 within half a second) it fails. The
docs/fleet.md's settings (health checks every second that act on one failure, retries backing off
from 300 ms) carry it past the next check, onto the other engine. The engine-level failover
(a session continuing on the other engine, the dead one's store intact) is
tests/engine/test_router_fleet.py."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest

from tests.engine.fleet import FAILOVER_ARGS, router, router_installed
from tests.engine.kv_events import complete
from tests.router_stubs import stop_worker, stub_worker

if not router_installed():
    pytest.skip("vllm-router is not installed (pip install -e '.[router]')",
                allow_module_level=True)


def _send(url: str) -> str:
    """The answering worker's name, or the router's HTTP error."""
    try:
        out = complete(url, "tiny", [1, 2, 3], headers={"X-Session-ID": "agent-1"}, timeout=60)
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    return out["choices"][0]["text"]


def _first_request_after_a_death(tmp_path: Path, args: list[str]) -> tuple[str, str]:
    """(the worker the session's home was, what the next request got once it stopped)."""
    workers = {name: stub_worker(name) for name in "ab"}  # name -> (url, server)
    try:
        with router([url for url, _ in workers.values()], "consistent_hash",
                    tmp_path / "router.log", args) as url:
            home = _send(url)
            stop_worker(workers[home][1])
            return home, _send(url)
    finally:
        for _, server in workers.values():
            stop_worker(server)


def test_the_readme_settings_fail_over_the_next_request(tmp_path):
    home, after = _first_request_after_a_death(tmp_path, FAILOVER_ARGS)
    assert after == {"a": "b", "b": "a"}[home], (home, after)


def test_control_the_default_retries_fail_it(tmp_path):
    """Without them (the router's default: a health check a minute) the same request fails:
    what the settings above are for."""
    home, after = _first_request_after_a_death(tmp_path, [])
    assert home in "ab" and after.startswith("HTTP 5"), (home, after)
