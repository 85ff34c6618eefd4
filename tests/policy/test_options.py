"""The histate policy's options are checked before a policy is built with them."""

import pytest

from histate_vllm.policy import Tier, check_options, make_policy

BUDGETS = {Tier.DRAM: 1 << 20, Tier.SSD: 1 << 24}


def test_valid_options_build_a_policy():
    good = {"tau": 600, "terminal_alpha": 0.1, "terminal_reuse": 0.0, "keep_backups": True,
            "drop_stuck": 0, "states_lead": False, "kv_bytes_per_token": 4096.0,
            "credit": True}
    check_options({**good, "max_intermediate": 0, "learn_min_tokens": 512})
    make_policy("histate", budgets=BUDGETS, block_tokens=256, max_intermediate=0, **good)


@pytest.mark.parametrize("name, value", [
    ("tau", 0), ("tau", float("inf")), ("terminal_alpha", 0.0), ("terminal_alpha", True),
    ("terminal_reuse", -0.1), ("kv_bytes_per_token", 0), ("keep_backups", "yes"),
    ("states_lead", 2), ("credit", "on"), ("bogus", 1),
])
def test_a_bad_option_is_named(name, value):
    with pytest.raises(ValueError, match=name):
        make_policy("histate", budgets=BUDGETS, block_tokens=256, **{name: value})


@pytest.mark.parametrize("name, value", [("max_intermediate", -1), ("learn_min_tokens", 1.5)])
def test_a_bad_planner_count_is_named(name, value):
    with pytest.raises(ValueError, match=name):
        make_policy("histate", budgets=BUDGETS, block_tokens=256, **{name: value})
