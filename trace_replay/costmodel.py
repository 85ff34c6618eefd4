"""Time and size model of one serving instance: model presets, device presets, and the costs
the simulator charges (prefill compute, restore transfers, decode steps).

    cm = CostModel(MODELS["qwen3.5-9b"], DEVICES["h100"])
    cm.prefill_time(0, 100_000)        # s to prefill 100K tokens from scratch
    cm.load_time(dram_bytes, ssd_bytes)

Prefill: FLOPs = 2·P·n (every matmul weight touched once per token; P excludes the embedding
table and counts only active experts) + causal attention 4·L_attn·H·d_h·Σ_t t over the new
tokens t (QKᵀ and PV, 2 FLOPs per multiply-add) + gated-delta-rule recurrence 8·L_lin·H_v·d_k·d_v
per token (state update, delta read-out and output, in the chunked form), at the device's
sustained rate = peak dense BF16 × MFU.

Restore (HiState paper eq. 2): T = X_dram / B_h2d + X_ssd / B_ssd + X_ssd / B_h2d.

Decode: one step streams the active weights from HBM: tpot = active weight bytes / (HBM
bandwidth × 0.7); a prefill takes at least one such step, and each chunk end a checkpoint
adds beyond vLLM's own split costs one more (`step_cost_tokens`) where the simulator charges
them. Decode only paces the closed loop (it is never part of TTFT).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

GiB = 1 << 30
GB = 10**9
TB = 10**12


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A hybrid (attention + Gated DeltaNet) model, from its config.json.

    block_tokens: vLLM's hybrid block size in align mode (attention page sized so one page per
    layer holds one layer's recurrent state, rounded up to a multiple of 64 tokens).
    """

    name: str
    attn_layers: int
    linear_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    lin_k_heads: int
    lin_v_heads: int
    lin_k_dim: int
    lin_v_dim: int
    conv_kernel: int
    matmul_params: float  # active, non-embedding (FLOPs per token = 2x this)
    weight_bytes: float  # all weights as served (GPU memory)
    active_weight_bytes: float  # read per decode step
    block_tokens: int
    kv_dtype_bytes: int = 2  # bf16
    ssm_dtype_bytes: int = 4  # fp32 recurrent state (vLLM/SGLang default for Qwen3.5/Next)
    conv_dtype_bytes: int = 2
    # Longest prompt the model serves (config.json max_position_embeddings); the replay's
    # default context limit (a session ends at its first longer request).
    context_tokens: int = 262_144

    @property
    def kv_bytes_per_token(self) -> int:
        return self.attn_layers * 2 * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def state_bytes(self) -> int:
        """One checkpoint: SSM state + conv history of every linear layer."""
        ssm = self.lin_v_heads * self.lin_k_dim * self.lin_v_dim * self.ssm_dtype_bytes
        conv_dim = 2 * self.lin_k_heads * self.lin_k_dim + self.lin_v_heads * self.lin_v_dim
        conv = conv_dim * (self.conv_kernel - 1) * self.conv_dtype_bytes
        return self.linear_layers * (ssm + conv)

    @property
    def block_bytes(self) -> int:
        """KV of one block (all attention layers)."""
        return self.block_tokens * self.kv_bytes_per_token


# Qwen3.5-9B (config.json via HF mirrors, see ../shared/notes/anchors-and-traces.md §4.1):
# hidden 4096, 32 layers = ([linear]*3 + [full]) * 8, 16 heads, 4 KV heads, head_dim 256
# (q with output gate), GDN 16 key / 32 value heads x 128, conv 4, intermediate 12288, vocab
# 248320 (untied). Matmul params per layer: MLP 3*4096*12288 = 151.0M; full attention
# (q+gate 8192 + k,v 2*1024 + o) x 4096 = 58.7M; GDN qkvz (2048+2048+4096+4096) x 4096 + out
# 4096x4096 = 67.1M => 32*151.0 + 8*58.7 + 24*67.1 = 6.92e9. Total ~8.95e9 with embeddings
# and lm_head (2 x 1.02e9) -> 17.9 GB bf16. KV 32,768 B/token, state 51,511,296 B
# (design.md §1). Block 576 = 9 x 64: one 576-token page of one attention layer (2.36 MB)
# holds one GDN layer's 2.15 MB state; HiState paper §4.1 uses 576-token blocks.
QWEN35_9B = ModelSpec(
    name="qwen3.5-9b", attn_layers=8, linear_layers=24, heads=16, kv_heads=4, head_dim=256,
    lin_k_heads=16, lin_v_heads=32, lin_k_dim=128, lin_v_dim=128, conv_kernel=4,
    matmul_params=6.92e9, weight_bytes=17.9 * GB, active_weight_bytes=17.9 * GB,
    block_tokens=576,
)

# Qwen3-Next-80B-A3B (config via vLLM configs/qwen3_next.py and HF mirrors, notes §4.1):
# hidden 2048, 48 layers (12 full + 36 GDN), 16 heads, 2 KV heads, head_dim 256, GDN 16/32
# heads x 128, 512 experts (10 routed + 1 shared active), moe_intermediate 512, vocab 151936.
# Active matmul params per layer: experts 11*3*2048*512 = 34.6M; full attention 27.3M; GDN
# 33.6M => 48*34.6 + 12*27.3 + 36*33.6 = 3.2e9 ("A3B"). 80e9 params -> 160 GB bf16 (needs
# TP or FP8 on one GPU; set --gpu-gib accordingly). KV 24,576 B/token, state 77,266,944 B.
# Block 1088 = 17 x 64 (align-mode block size reported for Qwen3-Coder-Next, same layer shapes:
# eugr/spark-vllm-docker PR #47, notes §2).
QWEN3_NEXT_80B_A3B = ModelSpec(
    name="qwen3-next-80b-a3b", attn_layers=12, linear_layers=36, heads=16, kv_heads=2,
    head_dim=256, lin_k_heads=16, lin_v_heads=32, lin_k_dim=128, lin_v_dim=128, conv_kernel=4,
    matmul_params=3.2e9, weight_bytes=160 * GB, active_weight_bytes=2 * 3.9e9,
    block_tokens=1088,
)

MODELS: dict[str, ModelSpec] = {m.name: m for m in (QWEN35_9B, QWEN3_NEXT_80B_A3B)}


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator and its host.

    peak_tflops: dense BF16 peak. mfu: fraction of it a long prefill sustains (assumption:
    0.5 for datacenter GPUs, a typical large-batch prefill MFU; override with --mfu).
    h2d_bw: host DRAM -> device copy bandwidth. ssd_bw: NVMe -> host read bandwidth.
    chunk_tokens: vLLM's default max_num_batched_tokens for `vllm serve` on this device
    (vllm/engine/arg_utils.py, 0.32: 8192 for >= 70 GiB non-A100, 16384 for >= 160 GiB).
    """

    name: str
    peak_tflops: float
    mfu: float
    hbm_bytes: float
    hbm_bw: float
    h2d_bw: float
    ssd_bw: float
    chunk_tokens: int

    @property
    def flops(self) -> float:
        return self.peak_tflops * 1e12 * self.mfu


# NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16, 80 GB HBM3 at 3.35 TB/s. PCIe 5.0 x16
# 64 GB/s and NVMe 5 GB/s are the HiState paper's §3.1 (Fig. 5b) assumptions.
H100 = DeviceSpec("h100", peak_tflops=989.0, mfu=0.5, hbm_bytes=80 * GB, hbm_bw=3.35 * TB,
                  h2d_bw=64 * GB, ssd_bw=5 * GB, chunk_tokens=8192)
# NVIDIA H200 datasheet: same Hopper compute (989 TFLOP/s BF16), 141 GB HBM3e at 4.8 TB/s;
# host link and NVMe as for H100.
H200 = DeviceSpec("h200", peak_tflops=989.0, mfu=0.5, hbm_bytes=141 * GB, hbm_bw=4.8 * TB,
                  h2d_bw=64 * GB, ssd_bw=5 * GB, chunk_tokens=8192)
# AMD Instinct MI300X datasheet: 1307.4 TFLOP/s dense BF16, 192 GB HBM3 at 5.3 TB/s; host
# link PCIe 5.0 x16 (64 GB/s); NVMe as above.
MI300X = DeviceSpec("mi300x", peak_tflops=1307.4, mfu=0.5, hbm_bytes=192 * GB,
                    hbm_bw=5.3 * TB, h2d_bw=64 * GB, ssd_bw=5 * GB, chunk_tokens=16384)
# AMD Ryzen AI Max+ 395 (Strix Halo): Radeon 8060S, 40 RDNA3.5 CUs x 2.9 GHz x 512 BF16
# FLOP/clk (WMMA) = 59.4 TFLOP/s peak; 128 GB LPDDR5X-8000 on 256 bits = 256 GB/s, unified.
# Measured by Gufo (docs/cache-redesign/cost-model.md, notes §5): 27B dense prefill of
# 101,545 tokens in 280.4 s => 2*27e9*101545/280.4 = 19.6 TFLOP/s sustained (MFU 0.33);
# pinned host copy ~85 GB/s; NVMe cold read 1.1 GB/s (dm-crypt).
STRIX_HALO = DeviceSpec("strix-halo", peak_tflops=59.4, mfu=0.33, hbm_bytes=128 * GB,
                        hbm_bw=256 * GB, h2d_bw=85 * GB, ssd_bw=1.1 * GB, chunk_tokens=8192)

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (H100, H200, MI300X, STRIX_HALO)}

# vLLM's default gpu_memory_utilization and a reserve for activations / CUDA graphs. With
# Qwen3.5-9B on an H100 this gives 45.3 GiB, the paper's 2,560 x 576-token blocks (45 GiB).
GPU_MEMORY_UTILIZATION = 0.9
ACTIVATION_RESERVE = 5 * GiB
# HiState paper §4.1: 96 GiB pinned CPU memory and 150 GiB of disk for caching.
DEFAULT_DRAM_BYTES = 96 * GiB
DEFAULT_SSD_BYTES = 150 * GiB


def default_gpu_cache_bytes(model: ModelSpec, device: DeviceSpec) -> int:
    free = GPU_MEMORY_UTILIZATION * device.hbm_bytes - model.weight_bytes - ACTIVATION_RESERVE
    return max(0, int(free))


class CostModel:
    def __init__(self, model: ModelSpec, device: DeviceSpec, *, mfu: float | None = None):
        if mfu is not None:
            device = replace(device, mfu=mfu)
        self.model = model
        self.device = device
        m = model
        self._lin = 2.0 * m.matmul_params
        self._gdn = 8.0 * m.linear_layers * m.lin_v_heads * m.lin_k_dim * m.lin_v_dim
        self._attn = 4.0 * m.attn_layers * m.heads * m.head_dim
        self._rate = device.flops
        self.tpot = m.active_weight_bytes / (device.hbm_bw * 0.7)

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs to compute tokens [start, end) given a cached prefix of `start` tokens."""
        n = end - start
        if n <= 0:
            return 0.0
        attn_pairs = (end * (end + 1) - start * (start + 1)) / 2.0
        return (self._lin + self._gdn) * n + self._attn * attn_pairs

    def prefill_time(self, start: int, end: int) -> float:
        """Seconds from the start of the prefill to the first token (at least one step)."""
        return max(self.prefill_flops(start, end) / self._rate, self.tpot)

    @property
    def step_cost_tokens(self) -> float:
        """One more engine step (a prefill chunk end vLLM would not take), in tokens of
        prefill: a step's fixed cost is one pass over the weights (tpot, the floor of any
        step here), against the per-token matmul and recurrence FLOPs."""
        return self.tpot * self._rate / (self._lin + self._gdn)

    def load_time(self, dram_bytes: float, ssd_bytes: float) -> float:
        """One restore alone: the SSD read, then every byte over the host-to-device link."""
        return self.ssd_read_time(ssd_bytes) + self.h2d_time(dram_bytes + ssd_bytes)

    def ssd_read_time(self, ssd_bytes: float) -> float:
        return ssd_bytes / self.device.ssd_bw

    def h2d_time(self, nbytes: float) -> float:
        return nbytes / self.device.h2d_bw

    def decode_time(self, output_tokens: int) -> float:
        return max(output_tokens - 1, 0) * self.tpot

    def describe(self) -> dict:
        m, d = self.model, self.device
        return {
            "model": m.name,
            "device": d.name,
            "block_tokens": m.block_tokens,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "state_bytes": m.state_bytes,
            "state_tokens_equiv": round(m.state_bytes / m.kv_bytes_per_token, 1),
            "sustained_tflops": round(d.flops / 1e12, 1),
            "h2d_gbps": d.h2d_bw / GB,
            "ssd_gbps": d.ssd_bw / GB,
            "tpot_ms": round(self.tpot * 1e3, 2),
            "cold_prefill_32k_s": round(self.prefill_time(0, 32768), 3),
        }


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)
