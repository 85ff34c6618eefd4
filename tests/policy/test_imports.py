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
