"""Engines and servers we start keep vLLM's IPC sockets in a private directory."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from histate_vllm.vllm_glue.rpc_dir import private_rpc_dir


def test_sockets_go_to_a_private_directory_removed_at_the_end(monkeypatch):
    short = Path(tempfile.mkdtemp(prefix="rpc"))  # pytest's tmp_path is too long for a socket
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    tmp_path = short
    with private_rpc_dir({}) as env:
        base = env["VLLM_RPC_BASE_PATH"]
        assert os.path.dirname(base) == str(tmp_path)
        # What vLLM does with it: bind ipc://<base>/<uuid4>, and never unlink it.
        path = os.path.join(base, "0" * 36)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)
        assert os.path.exists(path)
    assert list(tmp_path.iterdir()) == []
    short.rmdir()


def test_the_callers_choice_wins(tmp_path):
    with private_rpc_dir({"VLLM_RPC_BASE_PATH": str(tmp_path)}) as env:
        assert env == {}


def test_a_long_temp_dir_keeps_vllms_default(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with private_rpc_dir({}) as env:
        assert env == {}  # <dir>/<uuid> would not fit a socket address
    assert list(deep.iterdir()) == []
