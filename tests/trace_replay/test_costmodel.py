"""Cost model presets and formulas."""

import pytest

from trace_replay.costmodel import DEVICES, MODELS, CostModel, GiB, default_gpu_cache_bytes


def test_model_sizes_match_design_notes():
    q = MODELS["qwen3.5-9b"]
    assert q.kv_bytes_per_token == 32768
    assert q.state_bytes == 51_511_296
    assert q.block_tokens == 576
    n = MODELS["qwen3-next-80b-a3b"]
    assert n.kv_bytes_per_token == 24576
    assert n.state_bytes == 77_266_944
    assert n.block_tokens % 64 == 0
    # One page of one attention layer holds one GDN layer's state (vLLM's block sizing).
    for m in (q, n):
        per_layer_state = m.state_bytes / m.linear_layers
        per_layer_page = m.block_tokens * m.kv_bytes_per_token / m.attn_layers
        assert per_layer_page >= per_layer_state
        assert m.block_tokens - 64 < per_layer_state / (per_layer_page / m.block_tokens)


def test_default_gpu_pool_matches_the_paper_setup():
    # HiState §4.1: Qwen3.5-9B on one H100, 2,560 blocks of 576 tokens, ~45 GiB.
    b = default_gpu_cache_bytes(MODELS["qwen3.5-9b"], DEVICES["h100"])
    assert abs(b / GiB - 45) < 1
    assert 2500 < b / (576 * 32768) < 2620


def test_prefill_time_grows_superlinearly_with_context():
    cm = CostModel(MODELS["qwen3.5-9b"], DEVICES["h100"])
    t8, t16 = cm.prefill_time(0, 8192), cm.prefill_time(0, 16384)
    assert 2.0 < t16 / t8 < 2.5  # linear part plus a quadratic attention part
    # The same 8K new tokens cost more after a long cached prefix (attention over it).
    assert cm.prefill_time(100_000, 108_192) > t8
    assert cm.prefill_time(5000, 5000) == pytest.approx(cm.tpot)  # at least one step
    # Plausible scale: 100K cold tokens on an H100 take seconds, not ms or minutes.
    assert 2.0 < cm.prefill_time(0, 100_000) < 10.0


def test_attention_flops_formula():
    cm = CostModel(MODELS["qwen3.5-9b"], DEVICES["h100"])
    m = cm.model
    lin = cm.prefill_flops(0, 1) - 4 * m.attn_layers * m.heads * m.head_dim * 1
    assert cm.prefill_flops(10, 20) == pytest.approx(
        10 * lin + 4 * m.attn_layers * m.heads * m.head_dim * sum(range(11, 21)))


def test_restore_time_is_the_papers_equation_2():
    cm = CostModel(MODELS["qwen3.5-9b"], DEVICES["h100"])
    s = MODELS["qwen3.5-9b"].state_bytes
    # Paper §3.1: one checkpoint ~0.8 ms from DRAM, ~10.9 ms from SSD; 32K KV 16.8 / 231.5 ms.
    assert cm.load_time(s, 0) * 1e3 == pytest.approx(0.8, abs=0.05)
    assert cm.load_time(0, s) * 1e3 == pytest.approx(11.1, abs=0.3)
    kv = 32768 * 32768
    assert cm.load_time(kv, 0) * 1e3 == pytest.approx(16.8, abs=0.1)
    assert cm.load_time(0, kv) * 1e3 == pytest.approx(231.5, abs=0.5)


def test_every_device_and_model_combination_is_usable():
    for m in MODELS.values():
        for d in DEVICES.values():
            cm = CostModel(m, d)
            assert cm.tpot > 0 and cm.prefill_time(0, 4096) > 0
            assert set(cm.describe()) >= {"model", "device", "sustained_tflops"}


def test_strix_halo_sustained_rate_comes_from_its_measurement():
    d = DEVICES["strix-halo"]
    assert d.flops / 1e12 == pytest.approx(2 * 27e9 * 101545 / 280.4 / 1e12, rel=0.02)


def test_mfu_override():
    a = CostModel(MODELS["qwen3.5-9b"], DEVICES["h100"])
    b = CostModel(MODELS["qwen3.5-9b"], DEVICES["h100"], mfu=0.25)
    assert b.prefill_time(0, 32768) == pytest.approx(2 * a.prefill_time(0, 32768))
