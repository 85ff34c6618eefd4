"""Host rows without a GPU: page-aligned, independent, not pinned."""


def test_host_rows_each_start_on_a_page():
    from histate_vllm.datapath.hostmem import HostRows

    rows = HostRows(3, 5000, pin=False)
    assert rows.array.shape == (3, 5000) and rows.tensor.shape == (3, 5000)
    assert all(rows.array[i].ctypes.data % 4096 == 0 for i in range(3))
    rows.tensor[1] = 7
    assert not rows.tensor[0].any() and not rows.tensor[2].any()
    assert not rows.pinned  # nothing to register without a GPU


class FakeDriver:
    """cudaHostRegister / cudaHostUnregister stand-ins: refuses ranges above `limit` bytes
    (or every range), and records what is registered."""

    def __init__(self, limit=None):
        self.limit = limit
        self.live: dict[int, int] = {}
        self.calls: list[int] = []

    def register(self, ptr, nbytes):
        self.calls.append(nbytes)
        if self.limit is not None and nbytes > self.limit:
            return 1  # cudaErrorInvalidValue: as a driver past its pinned limit
        self.live[ptr] = nbytes
        return 0

    def unregister(self, ptr):
        del self.live[ptr]
        return 0

    @property
    def cudart(self):
        return self.register, self.unregister


def test_rows_are_pinned_at_construction_in_row_aligned_chunks(monkeypatch):
    from histate_vllm.datapath import hostmem

    monkeypatch.setattr(hostmem, "MAX_REGISTER_BYTES", 3 * 8192)
    drv = FakeDriver()
    rows = hostmem.HostRows(8, 5000, pin=True, cudart=drv.cudart)  # 8 KiB per padded row
    assert rows.pinned and drv.calls == [3 * 8192, 3 * 8192, 2 * 8192]
    base = rows.padded.data_ptr()
    assert sorted(drv.live) == [base, base + 3 * 8192, base + 6 * 8192]
    assert rows.breaks == (3, 6)  # a copy of a run of rows is cut there
    rows.close()
    assert drv.live == {} and not rows.pinned


def test_a_refused_chunk_falls_back_to_smaller_pinned_chunks(monkeypatch):
    from histate_vllm.datapath import hostmem

    monkeypatch.setattr(hostmem, "MIN_REGISTER_BYTES", 8192)
    drv = FakeDriver(limit=2 * 8192)
    rows = hostmem.HostRows(5, 8000, pin=True, cudart=drv.cudart)
    assert rows.pinned and sum(drv.live.values()) == 5 * 8192
    assert max(drv.live.values()) <= 2 * 8192
    # Chunks tile the rows exactly, each starting on a row; breaks name those rows.
    base = rows.padded.data_ptr()
    starts = sorted((p - base) // 8192 for p in drv.live)
    assert rows.breaks == tuple(starts[1:]) and starts[0] == 0
    rows.close()
    assert drv.live == {}


def test_pinning_that_cannot_succeed_fails_start_up_and_leaves_nothing_registered(monkeypatch):
    import pytest

    from histate_vllm.datapath import hostmem

    monkeypatch.setattr(hostmem, "MIN_REGISTER_BYTES", 8192)
    drv = FakeDriver(limit=4096)  # not even one row
    with pytest.raises(hostmem.PinError, match=r"refused to pin 8,192 bytes .*ulimit -l"):
        hostmem.HostRows(4, 8000, pin=True, cudart=drv.cudart)
    assert drv.live == {}
    drv = FakeDriver(limit=0)  # a one-row pool the driver refuses
    with pytest.raises(hostmem.PinError):
        hostmem.HostRows(1, 100, pin=True, cudart=drv.cudart)
