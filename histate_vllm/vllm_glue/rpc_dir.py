"""Where a vLLM process that HiState's tools start puts its ZMQ IPC sockets.

vLLM names them ipc://$VLLM_RPC_BASE_PATH/<uuid4> (default: the temp dir) and leaves the
socket files behind when its processes end: a test suite left ~15,000 in /tmp. Each engine
or server started by the offline runner, the replayer or the benchmarks gets a private
directory instead, removed when it stops. (No vLLM import: the replayer uses this too.)
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

# A socket path must fit sockaddr_un's 108 bytes: "<dir>/<36-char uuid>" and a NUL.
_SUN_PATH_MAX = 107
_UUID_LEN = 36


@contextmanager
def private_rpc_dir(env: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """Yield the variables to add to `env` (the started process's environment): a fresh
    VLLM_RPC_BASE_PATH, or nothing where the caller set one (theirs wins) or where a long
    TMPDIR would make socket paths too long (vLLM's default then)."""
    if env.get("VLLM_RPC_BASE_PATH"):
        yield {}
        return
    path = tempfile.mkdtemp(prefix="vllm-rpc-")
    try:
        if len(path) + 1 + _UUID_LEN > _SUN_PATH_MAX:
            yield {}
        else:
            yield {"VLLM_RPC_BASE_PATH": path}
    finally:
        shutil.rmtree(path, ignore_errors=True)
