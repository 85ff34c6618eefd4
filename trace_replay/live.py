"""Replay a workload against a running OpenAI-compatible server (vLLM) on this machine.

Prompts are token ids: each full block's tokens are a pure function of its chained block id
(so requests that share a prefix in the trace send identical prefixes), the partial tail's a
function of the request. Prompts are cut to `max_input_tokens` (a prefix, so sharing
survives). Each session is a closed loop: the next turn is sent `min(gap, max_delay) *
time_scale` after the previous response, where gap is the request's `think_time` (`gap=
"think"`) or the recorded arrival gap t[k] - t[k-1] (`gap="arrival"`, kv-cache-tester's
"original" timing). `concurrency` users each run one session at a time, taking the next in
workload order; with `recycle` a user that runs out of sessions starts the workload again,
salted so the new pass is a new conversation (as the load tester's recycled users).
`max_context` ends a session at its first request with more input tokens (kv-cache-tester's
--max-context); `warm_prefix_tokens` prepends the same tokens to every prompt (its shared
warm prefix).

Per request: TTFT = send to the first streamed choice; cached tokens from the final usage
chunk's `prompt_tokens_details.cached_tokens` (vLLM: `--enable-prompt-tokens-details`).
Bounded by `max_requests` and `max_time` (nothing is sent after it; requests in flight
finish, up to `request_timeout`); only loopback URLs are accepted.

The ceiling any cache could reach: per request, `shared_tokens`, the longest prefix it shares
with a prompt sent before it, in pieces of `block_tokens` (the server's block size; when it
is not known, `SHARE_GRAIN` tokens, a divisor of every vLLM block size). `summarize(records,
block_tokens)` turns it into `reusable_tokens`, what an unlimited cache with a state at every
block boundary would serve (whole blocks, never the last prompt token, as vLLM), so cached /
reusable is the engine's recovery.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import math
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlparse

import numpy as np

from .hashing import mix64_array, namespace_seed
from .metrics import hit_rate, percentiles
from .model import Request, Session, Workload
from .sim.engine import limit_context

MIN_TOKEN = 2  # keep clear of the lowest (special) ids
SHARE_GRAIN = 16  # tokens: vLLM block sizes are multiples of 16


@dataclass(frozen=True)
class LiveConfig:
    url: str = "http://127.0.0.1:8000"
    model: str | None = None
    concurrency: int = 4
    max_requests: int = 50
    max_time: float = 600.0
    time_scale: float = 0.0
    max_input_tokens: int = 7680
    max_output_tokens: int = 16
    vocab: int = 2000
    request_timeout: float = 300.0
    gap: str = "think"  # "think" (think_time) or "arrival" (recorded t[k] - t[k-1])
    max_delay: float = math.inf  # cap on one gap, s, before time_scale
    max_context: int = 0  # end a session at its first longer request (0: no limit)
    warm_prefix_tokens: int = 0  # the same tokens in front of every prompt
    recycle: bool = False  # users start the workload again (salted) when it runs out
    # Each request carries this header with its session's name (a router's session
    # affinity, e.g. vllm-router's consistent_hash on X-Session-ID); None: no header.
    session_header: str | None = None
    run: int = 0  # != 0: every prompt salted for this run (runs on one server share nothing)
    block_tokens: int = SHARE_GRAIN  # the server's block size, for the reuse ceiling
    # Send the client's breakpoints the trace records (Request.breakpoints) as
    # kv_transfer_params["histate_breakpoints"]; a server without HiState ignores them.
    breakpoints: bool = True

    def __post_init__(self) -> None:
        if self.gap not in ("think", "arrival"):
            raise ValueError(f"gap must be 'think' or 'arrival', got {self.gap!r}")
        if self.max_delay <= 0 or self.time_scale < 0:
            raise ValueError("max_delay must be > 0 and time_scale >= 0")
        if self.block_tokens <= 0 or self.block_tokens % SHARE_GRAIN:
            raise ValueError(f"block_tokens must be a positive multiple of {SHARE_GRAIN}, "
                             f"got {self.block_tokens}")


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"live replay only talks to this machine; {url!r} is not a loopback URL")


def warm_prefix(cfg: LiveConfig) -> list[int]:
    span = np.uint64(max(1, cfg.vocab - MIN_TOKEN))
    offs = np.arange(cfg.warm_prefix_tokens, dtype=np.uint64)
    tokens = mix64_array(namespace_seed("live-warm"), offs) % span
    return (tokens.astype(np.int64) + MIN_TOKEN).tolist()


def prompt_tokens(req: Request, block_size: int, cfg: LiveConfig, salt: int = 0) -> list[int]:
    """The prompt of `req`: the warm prefix, then the trace's tokens. `salt` (a recycled
    pass) and `cfg.run` change every trace token, so the pass (or run) shares only the warm
    prefix with others."""
    warm = warm_prefix(cfg) if cfg.warm_prefix_tokens else []
    n = max(1, min(req.input_tokens, cfg.max_input_tokens - len(warm)))
    span = np.uint64(max(1, cfg.vocab - MIN_TOKEN))
    offs = np.arange(block_size, dtype=np.uint64)
    parts = []
    ids = req.block_hashes.tolist()
    if salt or cfg.run:
        seed = (namespace_seed("live-pass", salt) if not cfg.run
                else namespace_seed("live-pass", salt, "run", cfg.run))
        ids = mix64_array(seed, np.asarray(ids, np.uint64)).tolist()
    full = min(n // block_size, len(ids))
    for bid in ids[:full]:
        parts.append(mix64_array(int(bid), offs).astype(np.uint64) % span)
    rest = n - full * block_size
    if rest:
        # Inside a full block of the trace the block's own tokens (a cut prompt stays a
        # prefix); past the last full block, tokens of this request only.
        seed = ids[full] if full < len(ids) else namespace_seed(
            "live-tail", req.session_id, req.index, salt, *(("run", cfg.run) if cfg.run else ()))
        parts.append(mix64_array(int(seed), offs[:rest]).astype(np.uint64) % span)
    return warm + (np.concatenate(parts).astype(np.int64) + MIN_TOKEN).tolist()


class SharedPrefixes:
    """Prompts sent so far, as chained digests of their `grain`-token pieces: how many
    leading tokens a new prompt shares with any of them. One 16-byte digest per piece is
    kept: the server's block size as the grain keeps a long replay's memory small."""

    def __init__(self, grain: int = SHARE_GRAIN) -> None:
        self.grain = grain
        self.seen: set[bytes] = set()

    def add(self, tokens: list[int]) -> int:
        """The shared prefix of `tokens` (a multiple of the grain), then remember them."""
        raw = np.asarray(tokens, dtype=np.int64).tobytes()
        step = 8 * self.grain
        digest, shared, matching = b"", 0, True
        for i in range(len(tokens) // self.grain):
            digest = hashlib.blake2b(digest + raw[i * step:(i + 1) * step],
                                     digest_size=16).digest()
            if matching and digest in self.seen:
                shared += self.grain
            else:
                matching = False
                self.seen.add(digest)
        return shared


def reusable(shared: int, prompt: int, block_tokens: int) -> int:
    """What an unlimited cache serves of a prompt sharing `shared` tokens: whole blocks,
    leaving at least the last prompt token to compute."""
    return min(shared, max(0, prompt - 1)) // block_tokens * block_tokens


def _gap(cfg: LiveConfig, prev: Request, req: Request) -> float:
    raw = req.think_time if cfg.gap == "think" else max(0.0, req.t - prev.t)
    return min(raw, cfg.max_delay) * cfg.time_scale


def _session_order(workload: Workload, cfg: LiveConfig):
    """(pass, session) in the order users take them; passes after the first are salted."""
    sessions = [s for s in workload.sessions if s.requests]
    k = 0
    while sessions:
        for s in sessions:
            yield k, s
        k += 1
        if not cfg.recycle:
            return


async def _first_model(client, url: str) -> str:
    r = await client.get(f"{url}/v1/models")
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def breakpoints(req: Request, n_tokens: int, cfg: LiveConfig) -> list[int]:
    """The trace's client breakpoints inside the prompt sent (after the warm prefix)."""
    if not cfg.breakpoints:
        return []
    warm = cfg.warm_prefix_tokens
    return [warm + b for b in req.breakpoints if 0 < warm + b <= n_tokens]


async def _complete(client, url: str, model: str, tokens: list[int], max_tokens: int,
                    timeout: float, t_start: float, headers: dict | None = None,
                    marks: list[int] | None = None) -> dict:
    body = {"model": model, "prompt": tokens, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    if marks:
        body["kv_transfer_params"] = {"histate_breakpoints": marks}
    t0 = time.perf_counter()
    ttft = None
    usage = None
    text: list[str] = []  # greedy output, to compare servers request by request
    arrivals: list[float] = []  # when each streamed chunk came, s since the replay began
    async with client.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout,
                             headers=headers) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            raise RuntimeError(f"HTTP {resp.status_code}: {text[:300]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("choices"):
                now = time.perf_counter()
                arrivals.append(round(now - t_start, 4))
                if ttft is None:
                    ttft = now - t0
                text.append(chunk["choices"][0].get("text") or "")
            if chunk.get("usage"):
                usage = chunk["usage"]
    latency = time.perf_counter() - t0
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {"ttft": ttft if ttft is not None else latency, "latency": latency,
            "prompt_tokens": (usage or {}).get("prompt_tokens", len(tokens)),
            "cached_tokens": details.get("cached_tokens"),
            "completion_tokens": (usage or {}).get("completion_tokens"),
            "output": "".join(text), "token_times": arrivals}


async def _replay(workload: Workload, cfg: LiveConfig, bar) -> tuple[list[dict], str, float]:
    import httpx

    url = cfg.url.rstrip("/")
    records: list[dict] = []
    budget = [cfg.max_requests]
    order = _session_order(workload, cfg)
    limits = httpx.Limits(max_connections=max(4, cfg.concurrency * 2))
    async with httpx.AsyncClient(limits=limits, timeout=cfg.request_timeout) as client:
        model = cfg.model or await _first_model(client, url)
        t_start = time.perf_counter()
        deadline = t_start + cfg.max_time
        sent = SharedPrefixes(cfg.block_tokens)

        async def user() -> None:
            for salt, s in order:  # one shared iterator: each session goes to one user
                if budget[0] <= 0 or time.perf_counter() >= deadline:
                    return
                await run_session(s, salt)

        async def run_session(s: Session, salt: int) -> None:
            for k, req in enumerate(s.requests):
                if k and cfg.time_scale > 0:
                    await asyncio.sleep(_gap(cfg, s.requests[k - 1], req))
                if budget[0] <= 0 or time.perf_counter() >= deadline:
                    return
                budget[0] -= 1
                tokens = prompt_tokens(req, workload.block_size, cfg, salt)
                rec = {"session": s.id, "pass": salt, "index": k, "label": req.label,
                       "sent": time.perf_counter() - t_start, "input_tokens": len(tokens),
                       "shared_tokens": sent.add(tokens)}
                try:  # sent before the deadline: it may finish after it
                    rec.update(await _complete(
                        client, url, model, tokens,
                        max(1, min(req.output_tokens, cfg.max_output_tokens)),
                        cfg.request_timeout, t_start,
                        {cfg.session_header: f"{cfg.run}-{salt}-{s.id}"}
                        if cfg.session_header else None, breakpoints(req, len(tokens), cfg)))
                    rec["ok"] = True
                except Exception as exc:  # noqa: BLE001 - recorded, never fatal
                    rec.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                records.append(rec)
                if bar is not None:
                    bar.update(1)

        await asyncio.gather(*(user() for _ in range(max(1, cfg.concurrency))))
    return records, model, time.perf_counter() - t_start


def decode_stalls(records: list[dict]) -> dict:
    """How long the server went without a streamed token while requests were decoding.

    A gap between two consecutive tokens (of any requests) counts when some request had
    its first token before the gap and its last after it: every decoding request waited.
    A server that freezes shows here, however its TTFTs average out."""
    spans = [(r["token_times"][0], r["token_times"][-1]) for r in records
             if r.get("ok") and len(r.get("token_times") or ()) > 1]
    times = np.sort(np.concatenate([r["token_times"] for r in records
                                    if r.get("ok") and r.get("token_times")] or [[]]))
    gaps = []
    if len(times) > 1 and spans:
        first, last = np.array(spans).T
        for a, b in zip(times[:-1], times[1:]):
            if b - a > 0 and np.any((first <= a) & (last >= b)):
                gaps.append(b - a)
    itl = [b - a for r in records if r.get("ok")
           for a, b in zip(r.get("token_times") or (), (r.get("token_times") or ())[1:])]
    return {"stall_max": float(max(gaps, default=0.0)),
            "stalls_over_1s": int(sum(g > 1.0 for g in gaps)),
            "itl_p99": float(np.percentile(itl, 99)) if itl else float("nan"),
            "itl_max": float(max(itl, default=float("nan")))}


def summarize(records: list[dict], block_tokens: int = SHARE_GRAIN) -> dict:
    """`block_tokens`: the server's block size, for the reuse ceiling (`reusable_tokens`)."""
    ok = [r for r in records if r.get("ok")]
    ttft = np.array([r["ttft"] for r in ok]) if ok else np.array([np.nan])
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] or 0 for r in ok)
    p50, p90, p95, p99 = np.percentile(ttft, [50, 90, 95, 99])
    return {"completed": len(ok), "failed": len(records) - len(ok),
            "ttft_p50": float(p50), "ttft_p90": float(p90), "ttft_p95": float(p95),
            "ttft_p99": float(p99), "ttft_max": float(np.max(ttft)),
            "ttft_mean": float(np.mean(ttft)), "prompt_tokens": int(prompt),
            "cached_tokens": int(cached), "hit_rate": cached / prompt if prompt else 0.0,
            "cached_tokens_reported": any(r.get("cached_tokens") is not None for r in ok),
            **reuse_ceiling(ok, block_tokens), **decode_stalls(records)}


def reuse_ceiling(ok: list[dict], block_tokens: int) -> dict:
    """Reusable tokens (see the module doc) and how the requests that pay split: TTFT of the
    requests an unlimited cache serves at least half of, and of the rest."""
    if not ok or any("shared_tokens" not in r for r in ok):
        return {}
    reuse = np.array([reusable(r["shared_tokens"], r["prompt_tokens"], block_tokens)
                      for r in ok])
    prompt = np.array([r["prompt_tokens"] for r in ok])
    cached = np.array([r["cached_tokens"] or 0 for r in ok])
    ttft = np.array([r["ttft"] for r in ok])
    warm = reuse >= prompt / 2
    out = {"reusable_tokens": int(reuse.sum()), "reusable_rate": hit_rate(reuse, prompt),
           "cached_of_reusable": hit_rate(cached, reuse),
           "warm_requests": int(warm.sum()), "cold_requests": int((~warm).sum())}
    for name, m in (("warm", warm), ("cold", ~warm)):
        p = percentiles(ttft[m])
        out[f"ttft_mean_{name}"], out[f"ttft_p99_{name}"] = p["ttft_mean"], p["ttft_p99"]
        out[f"cached_of_reusable_{name}"] = (hit_rate(cached[m], reuse[m])
                                             if reuse[m].sum() else float("nan"))
    return out


def replay_live(workload: Workload, cfg: LiveConfig, progress: bool = False) -> dict:
    check_loopback(cfg.url)
    if cfg.max_context > 0:
        workload, _ = limit_context(workload, max(1, cfg.max_context - cfg.warm_prefix_tokens))
    bar = None
    if progress:
        from tqdm import tqdm

        total = cfg.max_requests if cfg.recycle else min(cfg.max_requests, workload.n_requests)
        bar = tqdm(total=total, unit="req", desc="live", leave=False)
    try:
        records, model, wall = asyncio.run(_replay(workload, cfg, bar))
    finally:
        if bar is not None:
            bar.close()
    return {"settings": {**asdict(cfg), "model": model, "workload": workload.name,
                         "wall_s": round(wall, 2)},
            "summary": summarize(records, cfg.block_tokens), "requests": records}
