"""Live replay pieces that need no server: token-id prompts and the loopback guard."""

import pytest

from trace_replay import synth
from trace_replay.live import LiveConfig, check_loopback, prompt_tokens, replay_live

SHAPE = synth.Shape(n_sessions=2, turns=3, system_tokens=1024, new_tokens=1000,
                    output_tokens=8, jitter=0.0, stagger=False)


def test_shared_blocks_give_identical_tokens():
    wl = synth.append_pattern(SHAPE)
    cfg = LiveConfig(vocab=2000)
    a0, a1 = wl.sessions[0].requests[:2]
    b0 = wl.sessions[1].requests[0]
    t_a0, t_a1, t_b0 = (prompt_tokens(r, wl.block_size, cfg) for r in (a0, a1, b0))
    assert len(t_a0) == a0.input_tokens
    full = a0.input_tokens // wl.block_size * wl.block_size
    assert t_a1[:full] == t_a0[:full]  # the next turn extends the previous prompt
    assert t_b0[:1024] == t_a0[:1024]  # the shared system prompt
    assert t_b0[1024:1088] != t_a0[1024:1088]
    assert all(2 <= t < 2000 for t in t_a1)
    assert prompt_tokens(a1, wl.block_size, cfg) == t_a1  # deterministic


def test_prompts_are_cut_to_a_prefix():
    wl = synth.append_pattern(SHAPE)
    r = wl.sessions[0].requests[2]
    long = prompt_tokens(r, wl.block_size, LiveConfig())
    short = prompt_tokens(r, wl.block_size, LiveConfig(max_input_tokens=1500))
    assert short == long[:1500]


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:9"])
def test_loopback_urls_pass(url):
    check_loopback(url)


@pytest.mark.parametrize("url", ["http://example.com:8000", "http://10.0.0.5:8000",
                                 "http://0.0.0.0:8000"])
def test_other_urls_are_refused(url):
    with pytest.raises(ValueError, match="loopback"):
        check_loopback(url)
    with pytest.raises(ValueError, match="loopback"):
        replay_live(synth.append_pattern(SHAPE), LiveConfig(url=url))
