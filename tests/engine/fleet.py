"""Several HiState engines behind vLLM's router (`vllm-router`, the `router` extra): start
helpers shared by the fleet tests and benchmarks/bench_fleet.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.engine.kv_events import events_args, histate_connector
from trace_replay.server import free_port, local_server, metric_sum, metrics, serving

STARTUP_TIMEOUT = 300.0  # two engines share 2 cores here


# The router settings docs/fleet.md gives for a fleet whose engines can die ("When an engine
# dies"): checks every second acting on one failure, and retries backing off from 300 ms
# (~2.5 s in all, past the next check) so a request sent as an engine dies reaches another.
FAILOVER_ARGS = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                 "--retry-initial-backoff-ms", "300"]


def _router_path() -> str:
    return shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))


def router_installed() -> bool:
    return os.access(_router_path(), os.X_OK)


def router_binary() -> str:
    if not router_installed():
        raise RuntimeError("vllm-router is not installed: pip install -e '.[router]'")
    return _router_path()


@contextlib.contextmanager
def engine(model: str, work: Path, name: str, ssd: Path, endpoint: str | None,
           gpu_blocks: int, extra: Sequence[str] = (), ssd_bytes: int | None = None
           ) -> Iterator[str]:
    """One OpenAI server with HiState (its own ssd_dir) and, given an endpoint, vLLM's KV
    event publisher bound there."""
    args = ["--max-model-len", "8192", "--num-gpu-blocks-override", str(gpu_blocks),
            "--served-model-name", "tiny", *extra]
    if endpoint:
        args += events_args(endpoint)
    sizes = {} if ssd_bytes is None else {"ssd_bytes": ssd_bytes}
    with local_server(model, work / f"{name}.log", args=args,
                      connector=histate_connector(str(ssd), **sizes),
                      startup_timeout=STARTUP_TIMEOUT, cwd=str(work)) as url:
        yield url


@contextlib.contextmanager
def router(workers: Sequence[str], policy: str, log: Path, args: Sequence[str] = (),
           startup_timeout: float = 60.0) -> Iterator[str]:
    """vllm-router on a loopback port in front of `workers`; yields its URL."""
    port = free_port()
    # Its metrics on a port of its own too (the default one may be taken by another router).
    cmd = [router_binary(), "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
           "--worker-urls", *workers, "--policy", policy, *args]
    with serving(cmd, log, f"http://127.0.0.1:{port}", what="router",
                 startup_timeout=startup_timeout, poll_s=0.5, stop_timeout=10) as url:
        yield url


def loopback_relay(endpoint: str) -> str:
    """Forward a publisher bound on `endpoint` (ipc://) to a loopback TCP port; returns
    tcp://127.0.0.1:PORT. vllm-router reads only tcp://HOST:PORT sources, and vLLM's
    publisher binds a tcp endpoint only as a wildcard (every interface): the relay keeps
    the tests on loopback. The relay thread lives as long as the process."""
    import zmq
    from zmq.devices import ThreadProxy

    out = f"tcp://127.0.0.1:{free_port()}"
    dev = ThreadProxy(zmq.SUB, zmq.PUB)
    dev.connect_in(endpoint)
    dev.setsockopt_in(zmq.SUBSCRIBE, b"")
    dev.bind_out(out)
    dev.start()
    return out


def served(urls: Sequence[str]) -> list[float]:
    """Requests each engine has finished (vLLM's own counter)."""
    return [metric_sum(metrics(u), "vllm:request_success_total") for u in urls]


def which_engine(urls: Sequence[str], before: list[float]) -> int:
    """The engine that served the one request since `before` (index into urls)."""
    deadline = time.monotonic() + 10
    while True:
        after = served(urls)
        moved = [i for i, (a, b) in enumerate(zip(after, before)) if a > b]
        if len(moved) == 1 and sum(after) - sum(before) == 1:
            return moved[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no single engine served the request: {before} -> {after}")
        time.sleep(0.2)
