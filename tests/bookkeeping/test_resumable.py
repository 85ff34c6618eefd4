"""ResumableView: which keys each tier publishes as KV events, and their differences."""

from histate_vllm.bookkeeping.orchestration import Entry
from histate_vllm.bookkeeping.resumable import ResumableView
from histate_vllm.policy import Tier
from histate_vllm.policy.types import make_key

KV, ST = 0, 1  # group ids: one attention group, one state group


def kv(i: int) -> bytes:
    return make_key(bytes([i]) * 8, KV)


def st(i: int) -> bytes:
    return make_key(bytes([i]) * 8, ST)


def dram(is_state=False, position=0, refs=()):
    return Entry(is_state=is_state, position=position, slot=0, dram_ready=True, refs=refs)


def ssd(is_state=False, position=0, refs=()):
    return Entry(is_state=is_state, position=position, on_ssd=True, refs=refs)


def test_kv_counts_only_up_to_the_deepest_state_the_tier_holds():
    # Blocks 1..4 in DRAM, a state after block 2 in DRAM; block 3, 4 have no state after them.
    entries = {kv(i): dram(position=i * 16) for i in (1, 2, 3, 4)}
    entries[st(2)] = dram(is_state=True, position=32, refs=(kv(1), kv(2)))
    view = ResumableView(has_states=True)
    assert view.current(entries) == {Tier.DRAM: {kv(1), kv(2), st(2)}, Tier.SSD: set()}


def test_a_state_on_another_tier_does_not_make_kv_resumable_here():
    entries = {kv(1): dram(position=16), kv(2): ssd(position=32),
               st(2): ssd(is_state=True, position=32, refs=(kv(1), kv(2)))}
    view = ResumableView(has_states=True).current(entries)
    assert view[Tier.DRAM] == set()
    assert view[Tier.SSD] == {kv(2), st(2)}  # kv(1) is not on SSD


def test_both_copies_publish_on_both_tiers():
    e = Entry(is_state=False, position=16, slot=3, dram_ready=True, on_ssd=True)
    s = Entry(is_state=True, position=16, slot=4, dram_ready=True, on_ssd=True, refs=(kv(1),))
    view = ResumableView(has_states=True).current({kv(1): e, st(1): s})
    assert view[Tier.DRAM] == view[Tier.SSD] == {kv(1), st(1)}


def test_a_copy_in_flight_is_not_published():
    pending = Entry(is_state=True, position=16, slot=1, dram_ready=False, refs=(kv(1),))
    entries = {kv(1): dram(position=16), st(1): pending}
    assert ResumableView(True).current(entries)[Tier.DRAM] == set()


def test_restored_checkpoints_use_their_manifests():
    entries = {kv(1): ssd(position=16), st(1): ssd(is_state=True, position=16)}  # no refs
    view = ResumableView(has_states=True)
    assert view.current(entries)[Tier.SSD] == {st(1)}
    view.note_manifests({st(1): [kv(1)]})
    assert view.current(entries)[Tier.SSD] == {kv(1), st(1)}


def test_attention_only_models_publish_every_block():
    entries = {kv(1): dram(position=16), kv(2): ssd(position=32)}
    view = ResumableView(has_states=False).current(entries)
    assert view == {Tier.DRAM: {kv(1)}, Tier.SSD: {kv(2)}}


def test_changes_are_differences_stores_first_and_only_when_dirty():
    entries = {kv(1): dram(position=16), st(1): dram(is_state=True, position=16, refs=(kv(1),))}
    view = ResumableView(has_states=True, clock=lambda: 0.0)  # recomputing takes no time
    assert view.changes(entries) == [(Tier.DRAM, sorted([kv(1), st(1)]), False)]
    assert view.changes(entries) == []  # not dirty: nothing recomputed
    # The pair moves to SSD: stored there, then removed from DRAM.
    entries = {kv(1): ssd(position=16), st(1): ssd(is_state=True, position=16, refs=(kv(1),))}
    view.dirty = True
    assert view.changes(entries) == [(Tier.SSD, sorted([kv(1), st(1)]), False),
                                     (Tier.DRAM, sorted([kv(1), st(1)]), True)]
    # The state is lost: its KV no longer counts either.
    del entries[st(1)]
    view.dirty = True
    assert view.changes(entries) == [(Tier.SSD, sorted([kv(1), st(1)]), True)]


def test_recomputations_are_spaced_by_what_they_cost():
    """A view that took 10 ms to recompute is not recomputed for the next 190 ms (DUTY 5%):
    the change stays pending, and goes out at the first call after."""
    from histate_vllm.bookkeeping import resumable

    times = iter([0.0, 0.010, 0.100, 0.250, 0.250])
    view = ResumableView(has_states=True, clock=lambda: next(times))
    entries = {kv(1): dram(position=16), st(1): dram(is_state=True, position=16, refs=(kv(1),))}
    assert view.changes(entries)  # at 0.0, done at 0.010: next at 0.010 / DUTY = 0.2
    assert resumable.DUTY == 0.05
    del entries[st(1)]
    view.dirty = True
    assert view.changes(entries) == []  # at 0.100: too soon, still dirty
    assert view.dirty
    assert view.changes(entries) == [(Tier.DRAM, sorted([kv(1), st(1)]), True)]  # at 0.250
