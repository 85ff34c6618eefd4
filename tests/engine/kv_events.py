"""Helpers of the fleet tests: an OpenAI server with HiState and vLLM's KV event publisher,
a subscriber that decodes its batches with vLLM's own msgspec types, prompt hashes."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Sequence

MiB = 1 << 20
U64 = (1 << 64) - 1


def histate_connector(ssd_dir: str, dram_bytes: int = 4 * MiB, ssd_bytes: int = 64 * MiB
                      ) -> dict:
    return {"kv_connector": "HiStateConnector",
            "kv_connector_module_path": "histate_vllm.connector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"dram_bytes": dram_bytes, "ssd_dir": ssd_dir,
                                          "ssd_bytes": ssd_bytes}}


def events_args(endpoint: str) -> list[str]:
    """vLLM's own publisher, bound on an ipc:// endpoint. The topic stays vLLM's default
    (empty): vllm-router 0.1.17 drops batches under any other topic and has no option for
    it on static sources."""
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}
    return ["--kv-events-config", json.dumps(cfg)]


class EventSubscriber:
    """Collects every KVEventBatch a publisher sends, decoded by vLLM's msgspec type."""

    def __init__(self, endpoint: str):
        import msgspec
        import zmq

        from vllm.distributed.kv_events import KVEventBatch

        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)  # before the publisher binds: nothing is missed
        self.batches: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(200):
                continue
            topic, _seq, payload = self._sock.recv_multipart()
            batch = self._decoder.decode(payload)  # raises on anything else
            with self._lock:
                self.batches.append(batch)

    def events(self) -> list:
        with self._lock:
            return [e for b in self.batches for e in b.events]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()


def tier_view(events, medium: str) -> dict[int, set[int]]:
    """group_idx -> block hashes a medium holds after replaying its stores and removals
    (repeated announcements counted, as vLLM's offloading events ask of consumers)."""
    from collections import Counter

    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    held: dict[int, Counter] = {}
    for e in events:
        if isinstance(e, AllBlocksCleared):
            held.clear()
        elif getattr(e, "medium", None) != medium:
            continue
        elif isinstance(e, BlockStored):
            held.setdefault(e.group_idx, Counter()).update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            c = held.setdefault(e.group_idx, Counter())
            c.subtract(e.block_hashes)
    return {g: {h for h, n in c.items() if n > 0} for g, c in held.items()}


def prompt_hashes(tokens: Sequence[int], block: int, algo: str = "sha256") -> list[int]:
    """vLLM's prefix-cache hash of every full block of a token prompt, as its events carry
    them (the low 64 bits; VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on by default)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu

    fn = get_hash_fn_by_name(algo)
    kcu.init_none_hash(fn)
    out, parent = [], None
    for i in range(len(tokens) // block):
        parent = kcu.hash_block_tokens(fn, parent, tuple(tokens[i * block:(i + 1) * block]))
        out.append(int.from_bytes(parent, "big") & U64)
    return out


def complete(url: str, model: str, prompt: list[int], headers: dict | None = None,
             max_tokens: int = 1, timeout: float = 600) -> dict:
    """One /v1/completions call; returns its JSON (usage has cached_tokens)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body,
                                 {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def cached_tokens(response: dict) -> int:
    usage = response["usage"]
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
