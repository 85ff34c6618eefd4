"""`inspect` finishes with a message and an exit status, never a traceback, on anything
found on disk or given as a prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from histate_vllm.bookkeeping.eventlog import EventLogWriter, Lookup
from histate_vllm.bookkeeping.log_inspect import main, why


def _lookup(bt: int) -> Lookup:
    return Lookup(t=1.0, request_id="r", prompt_tokens=32, block_tokens=bt, covered=0,
                  gpu=0, position=0, shared=0, fps=[1, 2])


def test_zero_block_tokens_in_the_log():
    assert why([1] * 32, [], [_lookup(0)]) == "no lookups in the event log"
    assert "no logged request" in why([1] * 32, [], [_lookup(0), _lookup(16)])


@pytest.mark.parametrize("prompt", [{"prompt_token_ids": "abc"},
                                    {"prompt_token_ids": [1, "x"]},
                                    {"prompt_token_ids": [1 << 70]},
                                    [True, False]])
def test_bad_prompt_token_ids(tmp_path, prompt, capsys):
    log = EventLogWriter(str(tmp_path / "events"), interval=3600)
    log.append(lookups=[_lookup(16)])
    log.close()
    pf = tmp_path / "prompt.json"
    pf.write_text(json.dumps(prompt))
    with pytest.raises(SystemExit, match="must be a list of token ids"):
        main([str(tmp_path / "events"), "why", str(pf)])


def test_missing_prompt_file(tmp_path, capsys):
    (tmp_path / "events").mkdir()
    assert main([str(tmp_path / "events"), "why", str(tmp_path / "nope")]) == 1
    assert "No such file" in capsys.readouterr().err


def test_symlink_loop_and_fifo_log(tmp_path):
    os.symlink("loop", tmp_path / "loop")
    d = tmp_path / "events"
    d.mkdir()
    os.mkfifo(d / "events.log")  # never opened for a blocking read
    for target in (tmp_path, d):  # in a child with a deadline: a hang fails the test
        p = subprocess.run([sys.executable, "-m", "histate_vllm", "inspect", str(target)],
                           capture_output=True, text=True, timeout=60)
        assert "Traceback" not in p.stderr, p.stderr
        assert p.returncode in (0, 2), p.stderr
