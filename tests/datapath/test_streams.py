"""Transfer streams without a device: the CPU stream times its copies; a device event keeps
its launch (the copy descriptors) alive until it fired and times the copy alone."""

from __future__ import annotations

import time

from histate_vllm.datapath.streams import DeviceEvent, SyncStream


def test_sync_stream_runs_the_copy_at_once_and_times_it():
    ran = []
    event = SyncStream().launch(lambda: (time.sleep(0.02), ran.append(1)))
    assert ran == [1] and event.query()
    assert 0.015 < event.seconds() < 1.0


class FakeCudaEvent:
    def __init__(self, ms=0.0):
        self.fired, self.ms, self.waited = False, ms, 0

    def query(self):
        return self.fired

    def synchronize(self):
        self.waited += 1
        self.fired = True

    def elapsed_time(self, end):
        return end.ms - self.ms


def test_device_event_holds_the_descriptors_until_the_copy_fired():
    start, end = FakeCudaEvent(10.0), FakeCudaEvent(35.0)
    descriptors = object()
    event = DeviceEvent(start, end, descriptors)
    assert not event.query() and event.keep is descriptors
    assert event.seconds() is None  # not done: no time yet
    end.fired = True
    assert event.query() and event.keep is None
    assert event.seconds() == 0.025  # between the events around the copy, not since submit
    other = DeviceEvent(FakeCudaEvent(), FakeCudaEvent(), object())
    other.synchronize()
    assert other.keep is None and other.end.waited == 1
