"""The parts both drivers share (policy core, orchestration, telemetry and event log) import
neither vllm nor torch: the simulator runs them without either."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("imports", [
    "import histate_vllm.policy as p; p.make_policy('histate'); p.make_policy('lru')",
    "import histate_vllm.bookkeeping.orchestration",
    "import histate_vllm.bookkeeping.telemetry, histate_vllm.bookkeeping.eventlog",
])
def test_imports_neither_vllm_nor_torch(imports):
    code = (f"import sys; {imports}; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
