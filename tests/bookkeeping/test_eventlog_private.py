"""The event log names every request's prompt blocks: private to the engine's user."""

from __future__ import annotations

import os
import stat

import pytest

from histate_vllm.bookkeeping.eventlog import EventLogWriter, Lookup, read_log


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_event_log_is_private(tmp_path, umask):
    old = os.umask(umask)
    try:
        d = tmp_path / "events"
        log = EventLogWriter(str(d), interval=3600)
        log.append(lookups=[Lookup(t=0.0, request_id="r", prompt_tokens=32, block_tokens=16,
                                   covered=0, gpu=0, position=0, shared=0)])
        log.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d / "events.log").st_mode) == 0o600
    assert len(read_log(str(d))[1]) == 1


def test_event_log_link_does_not_append_to_its_target(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"precious")
    d = tmp_path / "events"
    d.mkdir(mode=0o700)
    os.symlink(target, d / "events.log")
    log = EventLogWriter(str(d), interval=3600)
    log.append(lookups=[Lookup(t=0.0, request_id="r", prompt_tokens=32, block_tokens=16,
                               covered=0, gpu=0, position=0, shared=0)])
    log.close()
    assert target.read_bytes() == b"precious"
