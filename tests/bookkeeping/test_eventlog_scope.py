"""The event log's fingerprints keep tenants apart: seeded with the cache_salt and LoRA
adapter vLLM salts its block hashes with, so `inspect why` compares within one salt and
adapter."""

from __future__ import annotations

import json

from histate_vllm.bookkeeping.eventlog import EventLogWriter, Lookup
from histate_vllm.bookkeeping.log_inspect import main, why


def test_fingerprints_differ_by_salt_and_adapter():
    from types import SimpleNamespace

    from histate_vllm.bookkeeping.eventlog import fingerprints, request_scope, scope_seed

    ids = list(range(64))
    none, a, b = (fingerprints(ids, 16, seed=scope_seed(s)) for s in (None, "A", "B"))
    lora = fingerprints(ids, 16, seed=scope_seed(None, "adapter"))
    assert len({tuple(x) for x in (none, a, b, lora)}) == 4
    assert not set(none) & set(a) and not set(a) & set(b)
    assert none == fingerprints(ids, 16)  # unsalted prompts: as logged before
    req = SimpleNamespace(cache_salt="A", lora_request=None)
    assert request_scope(req) == scope_seed("A")
    req = SimpleNamespace(cache_salt=None, lora_request=SimpleNamespace(lora_name="adapter"))
    assert request_scope(req) == scope_seed(None, "adapter")


def test_why_compares_within_one_salt(tmp_path):
    from histate_vllm.bookkeeping.eventlog import fingerprints, scope_seed

    ids = list(range(64))
    tenant_a = Lookup(t=1.0, request_id="tenant-a", prompt_tokens=64, block_tokens=16,
                      covered=0, gpu=0, position=0, shared=0,
                      fps=fingerprints(ids, 16, seed=scope_seed("A")))
    assert "no logged request shares" in why(ids, [], [tenant_a])  # unsalted prompt
    assert "no logged request shares" in why(ids, [], [tenant_a], scope_seed("B"))
    assert "closest logged request: tenant-a" in why(ids, [], [tenant_a], scope_seed("A"))
    log = EventLogWriter(str(tmp_path / "events"), interval=3600)
    log.append(lookups=[tenant_a])
    log.close()
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(ids))
    assert main([str(tmp_path / "events"), "why", str(pf), "--cache-salt", "A"]) == 0
