"""Real engines sharing a fleet tier on Mooncake Store (`fleet_mooncake_engine_cases.py`):
a session moves to another engine after a SIGKILL, exact; a dead or restarted master
costs no request more than the tier's deadlines. Run in a private network namespace, as
tests/store/test_fleet_mooncake.py explains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.store.test_fleet_mooncake import private_network_or_skip

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]


def test_engines_on_mooncake_in_a_private_network():
    inner = private_network_or_skip(
        f"{sys.executable} -m pytest -q -s -p no:cacheprovider "
        f"{REPO / 'tests/engine/fleet_mooncake_engine_cases.py'}")
    run = subprocess.run(["unshare", "-n", "sh", "-c", inner], cwd=REPO, capture_output=True,
                         text=True, timeout=2400, env=dict(os.environ, HISTATE_PRIVATE_NET="1"))
    tail = "\n".join(line for line in run.stdout.splitlines()
                     if "INFO" not in line and "WARNING" not in line)[-6000:]
    print(tail)
    assert run.returncode == 0, tail + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
