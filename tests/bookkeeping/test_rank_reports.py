"""SSD write outcomes across tensor-parallel ranks: a key is on SSD only once every rank
has written it (regression: ranks were ANDed within one step, so rank 0 alone freed it)."""

import pytest

from histate_vllm.bookkeeping.rank_reports import SSDReportTally, merge

K, J = b"k" * 36, b"j" * 36


def worker_meta(written: dict[bytes, bool], lost=()):
    from histate_vllm.connector import HiStateWorkerMetadata

    return HiStateWorkerMetadata(ssd_written={k: (1, ok) for k, ok in written.items()},
                                 ssd_lost=set(lost))


def test_rank_missing_from_a_step_does_not_count_as_written():
    # The bug: rank 0 {K: True} and rank 1 {} combined to {K: True}.
    step = worker_meta({K: True}).aggregate(worker_meta({}))
    assert step.ssd_written == {K: (1, True)}
    tally = SSDReportTally(num_ranks=2)
    assert tally.add(step.ssd_written) == {}
    assert tally.pending() == 1
    # Rank 1 finishes a step later: only now may the scheduler free the DRAM slot.
    later = worker_meta({}).aggregate(worker_meta({K: True}))
    assert tally.add(later.ssd_written) == {K: True}
    assert tally.pending() == 0


def test_one_failed_rank_fails_the_key():
    tally = SSDReportTally(num_ranks=2)
    assert tally.add(worker_meta({K: True, J: False}).ssd_written) == {}
    assert tally.add(worker_meta({K: False, J: True}).ssd_written) == {K: False, J: False}


def test_same_step_all_ranks():
    step = worker_meta({K: True}).aggregate(worker_meta({K: True}))
    assert step.ssd_written == {K: (2, True)}
    assert SSDReportTally(2).add(step.ssd_written) == {K: True}
    step = worker_meta({K: True}).aggregate(worker_meta({K: False}))
    assert SSDReportTally(2).add(step.ssd_written) == {K: False}


def test_aggregation_keeps_job_counts_and_lost_keys():
    a, b = worker_meta({}, lost=[K]), worker_meta({}, lost=[J])
    a.mark_completed(7)
    b.mark_completed(7)
    merged = a.aggregate(b)
    assert merged.completed_jobs == {7: 2}
    assert merged.ssd_lost == {K, J}


def test_one_rank_reports_every_step():
    tally = SSDReportTally(num_ranks=1)
    assert tally.add(worker_meta({K: True}).ssd_written) == {K: True}


def test_more_reports_than_ranks_is_a_bug():
    with pytest.raises(AssertionError, match="3 SSD reports"):
        SSDReportTally(2).add(merge({K: (2, True)}, {K: (1, True)}))


def test_four_ranks_across_three_steps():
    tally = SSDReportTally(num_ranks=4)
    assert tally.add(merge({K: (1, True)}, {J: (1, True)})) == {}
    assert tally.add(merge({K: (2, True)}, {J: (2, True)})) == {}
    assert tally.add({K: (1, True)}) == {K: True}
    assert tally.add({J: (1, True)}) == {J: True}
