from __future__ import annotations

import pytest
from store_helpers import IDENTITY

from histate_vllm.store import SSDStore


@pytest.fixture
def store(tmp_path) -> SSDStore:
    return SSDStore(tmp_path / "store", IDENTITY, budget_bytes=1 << 30)
