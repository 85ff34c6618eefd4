"""The KV cache layout HiState asks vLLM for, and the start-up checks of what it gets.

Every copy moves a block's page as one contiguous run of bytes; a layout that keeps heads
outside blocks (LHBNC, preferred by ROCm attention backends) would scatter a page, and
vLLM's worker views each layer as [num_blocks, page] bytes whatever its strides. These
tests hand the checks fake tensors with such strides and expect a clear error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

from histate_vllm.connector import HiStateConnector
from histate_vllm.datapath.pages import LayoutError, check_page_view, dense_page, group_views
from histate_vllm.vllm_glue.layout import check_kv_cache_pages

B, H, N, C = 6, 2, 16, 8  # blocks, KV heads, tokens per block, fp16 elements per token-head


@pytest.mark.parametrize("hisparse", [None, object()])
def test_required_layout_is_vllms_offloading_layout(hisparse):
    cfg = SimpleNamespace(attention_config=SimpleNamespace(hisparse_config=hisparse))
    want = OffloadingConnector.get_required_kvcache_layout(cfg)
    assert HiStateConnector.get_required_kvcache_layout(cfg) == want
    assert want == ("LBHNC" if hisparse is None else "BLHNC")


def _config(layers=("a", "b")):
    spec = FullAttentionSpec(block_size=N, num_kv_heads=H, head_size=C // 2,
                             dtype=torch.float16)
    return KVCacheConfig(num_blocks=B, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(list(layers), spec)]), spec


def _lbhnc():
    """Block-major: each block's [H, N, C] is one run (the layout asked for)."""
    return torch.zeros(B, H, N, C, dtype=torch.float16)


def _lhbnc():
    """Heads outside blocks: block b, head h starts at (h * B + b) * N * C."""
    base = torch.zeros(H * B * N * C, dtype=torch.float16)
    return base.as_strided((B, H, N, C), (N * C, B * N * C, C, 1))


def test_block_major_pages_pass():
    config, spec = _config()
    assert spec.unpadded_page_size_bytes == H * N * C * 2
    check_kv_cache_pages({"a": _lbhnc(), "b": _lbhnc()}, config)
    # Token-major inside the block (NHC storage of a logical [B, H, N, C]) is still one run.
    nhc = torch.zeros(B, N, H, C, dtype=torch.float16).permute(0, 2, 1, 3)
    assert dense_page(nhc[0])
    check_kv_cache_pages({"a": nhc, "b": _lbhnc()}, config)
    # BLHNC: layers interleaved per block, a block stride larger than the page.
    both = torch.zeros(B, 2, H, N, C, dtype=torch.float16)
    check_kv_cache_pages({"a": both[:, 0], "b": both[:, 1]}, config)


def test_heads_outside_blocks_stop_start_up():
    config, _ = _config()
    with pytest.raises(LayoutError, match=r"layer b: .*not one contiguous run.*LBHNC"):
        check_kv_cache_pages({"a": _lbhnc(), "b": _lhbnc()}, config)


def test_overlapping_or_short_blocks_stop_start_up():
    config, _ = _config()
    flat = torch.zeros(B * H * N * C, dtype=torch.float16)
    overlap = flat.as_strided((B, H, N, C), (N * C, N * C, C, 1))  # stride < page
    with pytest.raises(LayoutError, match="not one contiguous run|blocks overlap"):
        check_kv_cache_pages({"a": overlap, "b": _lbhnc()}, config)
    half = torch.zeros(B, H, N // 2, C, dtype=torch.float16)  # half a page per block
    with pytest.raises(LayoutError, match="a block holds 256 bytes, its page is 512"):
        check_kv_cache_pages({"a": half, "b": _lbhnc()}, config)


def test_page_views_are_checked():
    good = torch.zeros(B, 64, dtype=torch.int8)
    check_page_view(good, 64, "t")
    with pytest.raises(LayoutError, match="page bytes are strided"):
        check_page_view(torch.zeros(64, B, dtype=torch.int8).t(), 64, "t")
    with pytest.raises(LayoutError, match="int8"):
        check_page_view(torch.zeros(B, 16, dtype=torch.float32), 16, "t")
    with pytest.raises(LayoutError, match="layer page of 80 bytes in a 64-byte view"):
        check_page_view(good, 80, "t")
    with pytest.raises(LayoutError, match="blocks overlap"):
        check_page_view(good.view(-1).as_strided((B, 64), (32, 1)), 64, "t")
    # A block stride larger than the page (a shared hybrid tensor) is fine.
    check_page_view(torch.zeros(B, 96, dtype=torch.int8)[:, :64], 64, "t")


def test_group_views_lay_layers_end_to_end_within_a_key():
    tensors = [torch.zeros(B, 64, dtype=torch.int8), torch.zeros(B, 32, dtype=torch.int8)]
    refs = [[SimpleNamespace(tensor_idx=0, page_size_bytes=60),
             SimpleNamespace(tensor_idx=1, page_size_bytes=32)]]
    groups = group_views(tensors, refs, key_bytes=92)
    assert [(t is tensors[i], n, off) for i, (t, n, off) in enumerate(groups[0])] == [
        (True, 60, 0), (True, 32, 60)]
    with pytest.raises(LayoutError, match="group 0 needs 92 bytes per key, a slot has 91"):
        group_views(tensors, refs, key_bytes=91)
