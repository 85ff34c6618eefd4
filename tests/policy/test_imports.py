import subprocess
import sys


def test_policy_imports_neither_vllm_nor_torch():
    code = (
        "import sys; import histate_vllm.policy as p; "
        "p.make_policy('histate'); p.make_policy('lru'); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_api_names():
    import pytest

    from histate_vllm.policy import (  # noqa: F401
        Admission,
        Hit,
        Item,
        Kind,
        PolicyCore,
        Tier,
        make_policy,
    )

    with pytest.raises(ValueError, match="valid"):
        make_policy("arc")
    with pytest.raises(ValueError):
        make_policy("histate", interval="sometimes")
