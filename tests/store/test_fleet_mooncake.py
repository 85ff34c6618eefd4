"""The fleet tier on a real Mooncake Store (`fleet_mooncake_cases.py`), run in a private
network namespace with loopback alone: Mooncake's metadata server and transfer engine
listen on every interface whatever they are told, so the master, the segment holder and
every engine of these cases are reachable from this machine's loopback and nowhere else.

Needs the `fleet` extra (Mooncake Store; scripts/setup.sh installs it with the Debian
libraries its binaries load) and `unshare -n` (root, as here and in CI)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def private_network_or_skip(command: str) -> str:
    """The shell line that runs `command` in a private network namespace (a veth pair with a
    link-local address beside loopback), or a skip saying what this machine lacks."""
    if importlib.util.find_spec("mooncake") is None:
        pytest.skip("Mooncake Store is not installed (the fleet extra: scripts/setup.sh)")
    loads = subprocess.run([sys.executable, "-c", "import mooncake.store"],
                           capture_output=True, text=True)
    if loads.returncode != 0:
        pytest.skip("Mooncake Store does not load (Debian's libibverbs1, libnl-3-200, "
                    f"libnl-route-3-200?): {loads.stderr.strip()[-300:]}")
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no network namespace here: {probe.stderr.strip()}")
    # Mooncake's transfer engine starts only where it finds a non-loopback address: a veth
    # pair with a link-local one, in this namespace alone (traffic still goes to the
    # 127.0.0.1 everything advertises).
    return ("ip link set lo up && ip link add hs0 type veth peer name hs1 && "
            "ip addr add 169.254.77.1/32 dev hs0 && ip link set hs0 up && "
            f"ip link set hs1 up && exec {command}")


def test_fleet_tier_on_mooncake_in_a_private_network():
    inner = private_network_or_skip(
        f"{sys.executable} -m pytest -q -p no:cacheprovider "
        f"{REPO / 'tests/store/fleet_mooncake_cases.py'}")
    run = subprocess.run(["unshare", "-n", "sh", "-c", inner], cwd=REPO, capture_output=True,
                         text=True, timeout=900,
                         env=dict(os.environ, HISTATE_PRIVATE_NET="1"))
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
