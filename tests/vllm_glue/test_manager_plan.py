"""The manager plans checkpoints on the chunk ends vLLM takes anyway where a step is priced."""

import pytest

pytest.importorskip("vllm")

from histate_vllm.config import HiStateConfig  # noqa: E402
from histate_vllm.policy.chunk_grid import extra_steps  # noqa: E402
from histate_vllm.vllm_glue.layout import CacheLayout  # noqa: E402
from histate_vllm.vllm_glue.manager import HiStateManager  # noqa: E402

BT = 384
KEY = 1000
LAYOUT = CacheLayout(group_ids=(0, 1), state_group_ids=frozenset({1}), key_bytes=KEY,
                     block_tokens=BT)


class Req:
    def __init__(self, rid, n):
        self.request_id, self.num_prompt_tokens = rid, n
        self.block_hashes = [rid.encode() + i.to_bytes(31, "big") for i in range(n // BT)]
        self.prompt_token_ids = list(range(n))


def plan(step_cost, n=3000, chunk=2048):
    extra = {"dram_bytes": 100 * KEY}
    if step_cost is not None:
        extra["step_cost_tokens"] = step_cost
    cfg = HiStateConfig.from_extra_config(extra)
    m = HiStateManager(LAYOUT, cfg, tokens_per_hash=BT, max_model_len=1 << 16,
                       step_tokens=chunk, chunk_tokens=chunk)
    r = Req("r", n)
    m.register_request(r)
    m.note_hit(r, 0, 0, None)
    return m.capture_positions(r)


def test_a_cold_prompt_keeps_vllms_steps_where_a_step_costs():
    """3,000 tokens, 2,048-token steps: vLLM ends chunks at 1,920, 2,688 and 3,000. A free
    chunk end leaves the interval checkpoint at I* (2,304: a fourth step); a priced one
    moves it to 1,920."""
    end = 3000 // BT * BT
    free = plan(0)
    assert extra_steps([p for p in free if p < end], 0, end, 1920) == 1
    priced = plan(256)
    assert priced[-1] == end and len(priced) == len(free)
    assert extra_steps([p for p in priced if p < end], 0, end, 1920) == 0


def test_chunk_ends_are_priced_by_default_one_block_until_measured():
    assert HiStateConfig(dram_bytes=1).step_cost_tokens == "auto"
    assert plan(None) == plan(BT)


def test_a_measured_price_reaches_the_planner():
    """The connector's measurement (set_step_cost) prices the next plans: free again
    where the engine's steps cost nothing."""
    cfg = HiStateConfig.from_extra_config({"dram_bytes": 100 * KEY})
    m = HiStateManager(LAYOUT, cfg, tokens_per_hash=BT, max_model_len=1 << 16,
                       step_tokens=2048, chunk_tokens=2048)
    m.set_step_cost(0.0, 0.0, 1e-4)
    r = Req("r", 3000)
    m.register_request(r)
    m.note_hit(r, 0, 0, None)
    assert m.capture_positions(r) == plan(0)


def test_the_first_message_end_is_found_in_the_token_ids_and_planned():
    """A chat template closes each message with a turn-end token, one of the request's stop
    tokens: the first one in the prompt ends its system prompt and tools. The plan takes
    the block boundary at or before it; a prompt without one gets no such point."""
    from types import SimpleNamespace

    from histate_vllm.vllm_glue.boundaries import first_message_end

    r = Req("m", 3000)
    r.prompt_token_ids = [5] * 3000
    r.prompt_token_ids[1000] = r.prompt_token_ids[2000] = 9  # two message ends
    r.sampling_params = SimpleNamespace(all_stop_token_ids={9, 7})
    assert first_message_end(r) == (1001,)
    cfg = HiStateConfig.from_extra_config({"dram_bytes": 100 * KEY})
    m = HiStateManager(LAYOUT, cfg, tokens_per_hash=BT, max_model_len=1 << 16,
                       step_tokens=2048, chunk_tokens=2048)
    m.register_request(r)
    m.note_hit(r, 0, 0, None)
    assert 1001 // BT * BT in m.capture_positions(r)
    r.sampling_params = SimpleNamespace(all_stop_token_ids={7})
    assert first_message_end(r) == ()
    del r.sampling_params
    assert first_message_end(r) == ()


def test_client_breakpoints_are_planned_and_bad_ones_skipped(caplog):
    """`kv_transfer_params["histate_breakpoints"]`: token positions the client marks (as
    Anthropic's cache_control). Valid ones are planned at the block boundary at or before
    them; a bad value is logged and skipped, never failing the request."""
    from histate_vllm.vllm_glue.boundaries import (
        BREAKPOINTS_KEY,
        MAX_BREAKPOINTS,
        client_breakpoints,
        prompt_boundaries,
    )

    r = Req("b", 3000)
    assert client_breakpoints(r) == ()  # no kv_transfer_params at all
    r.kv_transfer_params = {"other": 1}
    assert client_breakpoints(r) == ()
    r.kv_transfer_params = {BREAKPOINTS_KEY: [800, 1700]}
    assert prompt_boundaries(r) == (800, 1700)  # no stop tokens known: no message end
    cfg = HiStateConfig.from_extra_config({"dram_bytes": 100 * KEY})
    m = HiStateManager(LAYOUT, cfg, tokens_per_hash=BT, max_model_len=1 << 16,
                       step_tokens=2048, chunk_tokens=2048)
    m.register_request(r)
    m.note_hit(r, 0, 0, None)
    got = m.capture_positions(r)
    assert {800 // BT * BT, 1700 // BT * BT} <= set(got)
    assert 800 // BT * BT not in plan(None)  # the uncued plan has no point there

    with caplog.at_level("WARNING"):
        r.kv_transfer_params = {BREAKPOINTS_KEY: [0, -5, 3001, "9", True, 1.5, 900]}
        assert client_breakpoints(r) == (900,)
        r.kv_transfer_params = {BREAKPOINTS_KEY: "900"}
        assert client_breakpoints(r) == ()
        r.kv_transfer_params = {BREAKPOINTS_KEY: list(range(1, 100))}
        assert client_breakpoints(r) == tuple(range(1, MAX_BREAKPOINTS + 1))
    text = caplog.text
    assert "not token positions" in text and "must be a list" in text and "only the first" in text

