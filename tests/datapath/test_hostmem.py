"""Host rows without a GPU: page-aligned, independent, not pinned."""


def test_host_rows_each_start_on_a_page():
    from histate_vllm.datapath.hostmem import HostRows

    rows = HostRows(3, 5000, pin=False)
    assert rows.array.shape == (3, 5000) and rows.tensor.shape == (3, 5000)
    assert all(rows.array[i].ctypes.data % 4096 == 0 for i in range(3))
    rows.tensor[1] = 7
    assert not rows.tensor[0].any() and not rows.tensor[2].any()
    assert not rows.pinned  # nothing to register without a GPU
