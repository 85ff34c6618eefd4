"""The router settings the README gives for a fleet whose engines can die ("When an engine
dies"), checked against vllm-router itself with stub workers (the `router` extra).

A request sent after an engine died but before a health check noticed is retried by the
router on that same engine; with its default retries (5 within half a second) it fails. The
README's settings (health checks every second that act on one failure, retries backing off
from 300 ms) carry it past the next check, onto the other engine. The engine-level failover
(a session continuing on the other engine, the dead one's store intact) is
tests/engine/test_router_fleet.py."""

from __future__ import annotations

import shutil
import sys
import urllib.error
from pathlib import Path

import pytest

if not (shutil.which("vllm-router") or Path(sys.executable).with_name("vllm-router").exists()):
    pytest.skip("vllm-router is not installed (pip install -e '.[router]')",
                allow_module_level=True)

from tests.engine.fleet import router  # noqa: E402
from tests.engine.kv_events import complete  # noqa: E402
from tests.router_stubs import stop_worker, stub_worker  # noqa: E402

README_ARGS = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1",
               "--retry-initial-backoff-ms", "300"]


def _send(url: str) -> str:
    """The answering worker's name, or the router's HTTP error."""
    try:
        out = complete(url, "tiny", [1, 2, 3], headers={"X-Session-ID": "agent-1"}, timeout=60)
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    return out["choices"][0]["text"]


def _first_request_after_a_death(tmp_path: Path, args: list[str]) -> tuple[str, str]:
    """(the worker the session's home was, what the next request got once it stopped)."""
    workers = dict(stub_worker(n) for n in "ab")
    names = dict(zip(workers, "ab"))
    with router(list(workers), "consistent_hash", tmp_path / "router.log", args) as url:
        home = _send(url)
        stop_worker(next(s for u, s in workers.items() if names[u] == home))
        after = _send(url)
    for s in workers.values():
        stop_worker(s)
    return home, after


def test_the_readme_settings_fail_over_the_next_request(tmp_path):
    home, after = _first_request_after_a_death(tmp_path, README_ARGS)
    assert after == {"a": "b", "b": "a"}[home], (home, after)


def test_control_the_default_retries_fail_it(tmp_path):
    """Without them (the router's default: a health check a minute) the same request fails:
    what the settings above are for."""
    home, after = _first_request_after_a_death(tmp_path, [])
    assert home in "ab" and after.startswith("HTTP 5"), (home, after)
