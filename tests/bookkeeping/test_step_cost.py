"""The engine step's fixed cost, measured from the times between steps (step_cost.py)."""

import random

import pytest

from histate_vllm.bookkeeping.step_cost import StepCost


def run(cost: StepCost, steps, t0: float = 0.0) -> float:
    """Feed (tokens, duration) steps as the connector sees them: one call per step."""
    t = t0
    for n, d in steps:
        cost.step(t, n)
        t += d
    return t


def steps(fixed, per_token, sizes, rng, noise=0.0):
    return [(n, fixed + per_token * n + rng.uniform(0, noise)) for n in sizes]


def test_the_price_is_the_fixed_cost_in_tokens_and_the_prior_until_measured():
    rng = random.Random(0)
    cost = StepCost(384, min_tokens=384)
    run(cost, steps(0.025, 1e-4, [384] * 40, rng))
    assert not cost.measured and cost.tokens == 384  # one size: a step's cost can't be told
    sizes = [rng.choice([384, 768, 1152, 1920, 2048]) for _ in range(64)]
    run(cost, steps(0.025, 1e-4, sizes, rng, noise=0.002), t0=100.0)
    assert cost.measured
    assert cost.tokens == pytest.approx(250, rel=0.1)
    assert cost.fixed_s == pytest.approx(0.026, rel=0.1)


def test_idle_gaps_and_decode_steps_do_not_move_it():
    """A request arriving at a quiet engine puts a long gap after one step; decode steps
    (below min_tokens) and steps with nothing scheduled are not timed."""
    rng = random.Random(1)
    cost = StepCost(384, min_tokens=384)
    seq = []
    for _ in range(40):
        seq += steps(0.010, 5e-5, [rng.choice([512, 1024, 2048])], rng, noise=0.001)
        seq += [(1, 0.004)] * 3 + [(0, 0.001)]
        if rng.random() < 0.2:
            seq.append((768, 0.010 + 768 * 5e-5 + 30.0))  # then the engine waited 30 s
    run(cost, seq)
    assert cost.measured
    assert cost.tokens == pytest.approx(200, rel=0.15)


def test_free_steps_price_nothing():
    rng = random.Random(2)
    cost = StepCost(384, min_tokens=1)
    run(cost, steps(0.0, 1e-4, [rng.randrange(100, 2048) for _ in range(64)], rng))
    assert cost.measured and cost.tokens == pytest.approx(0, abs=1)


def test_with_async_scheduling_a_duration_belongs_to_the_step_before():
    """vLLM schedules step k+1 before step k's output is back: the time after a build is
    the previous step's."""
    rng = random.Random(3)
    sizes = [rng.choice([384, 1152, 2048]) for _ in range(80)]
    seq = steps(0.020, 1e-4, sizes, rng, noise=0.001)
    shifted = [(n, seq[i - 1][1] if i else 0.0) for i, (n, _) in enumerate(seq)]
    lagged, naive = StepCost(384, min_tokens=384, lag=1), StepCost(384, min_tokens=384)
    run(lagged, shifted)
    run(naive, shifted)
    assert lagged.tokens == pytest.approx(200, rel=0.1)
    assert abs(naive.tokens - 200) > 0.5 * 200  # without the lag the fit is wrong


def test_a_steady_price_is_refitted_less_and_less_often_and_a_change_still_lands():
    rng = random.Random(4)
    cost = StepCost(384, min_tokens=384, window=64)
    fits = []
    fit = cost._fit
    cost._fit = lambda: fits.append(1) or fit()
    sizes = [rng.choice([384, 1152, 2048]) for _ in range(600)]
    t = run(cost, steps(0.020, 1e-4, sizes, rng, noise=0.001))
    assert cost.tokens == pytest.approx(200, rel=0.1)
    assert len(fits) < 600 // 8 // 3  # backed off to one fit per window
    run(cost, steps(0.060, 1e-4, sizes, rng, noise=0.001), t0=t + 1.0)
    assert cost.tokens == pytest.approx(600, rel=0.1)
