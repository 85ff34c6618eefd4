"""histate-oracle: HiState that drops what no later request uses (a reference that knows the
future), and is run only when named."""

from _sim_helpers import MB, SessionBuilder, rid, run, workload

from trace_replay.cli import _policy_list
from trace_replay.policies import ORACLES

GiB = 1 << 30


def _return_after_a_dead_session():
    """A comes back late to its prompt; meanwhile B and C each send one long prompt and end.
    DRAM holds about two of the three prompts."""
    a = SessionBuilder("A").turn(12000).turn(200, think=300.0)
    b = SessionBuilder("B", start=20.0).turn(12000)
    c = SessionBuilder("C", start=150.0).turn(12000)
    return workload(a, b, c)


def test_dead_data_makes_room_for_what_returns():
    wl = _return_after_a_dead_session()
    kw = dict(gpu=200 * MB, dram=int(1.1 * GiB), ssd=0)
    prep, base = run(wl, "histate", **kw)
    _, oracle = run(wl, "histate-oracle", **kw)
    i = rid(prep, "A", 1)
    assert base.hit[i] < 12000 // 64 * 64 // 2  # B's and C's newer prompts pushed A's out
    assert oracle.hit[i] >= 12000 // 64 * 64 - 64  # theirs went when they ended
    assert oracle.stats["oracle_dropped"] > 0


def test_nothing_a_later_request_uses_is_dropped():
    """Without pressure the oracle resumes exactly where HiState does."""
    wl = workload(SessionBuilder("A").turn(3000).turn(300, think=100.0, cut=2000)
                  .turn(200, think=50.0))
    kw = dict(gpu=100 * MB, dram=8 * GiB, ssd=0)
    _, base = run(wl, "histate", **kw)
    _, oracle = run(wl, "histate-oracle", **kw)
    assert list(oracle.hit) == list(base.hit)


def test_all_leaves_the_oracle_out():
    assert not set(ORACLES) & set(_policy_list("all"))
    assert _policy_list("histate-oracle") == ["histate-oracle"]
