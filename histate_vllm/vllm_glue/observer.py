"""What the manager tells operators: metrics, the INFO summary line and the event log.

`HiStateManager` calls one hook per event it sees (a lookup, a load issued or completed,
SSD writes issued or reported, a request finished) and hands the policy's drained events
over through `Orchestrator.on_events`. Counting and miss causes are in bookkeeping/telemetry.py (no
vllm), the metric definitions in prom_metrics.py, the on-disk log in bookkeeping/eventlog.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence

from vllm.logger import init_logger

from histate_vllm.bookkeeping.eventlog import (
    EventLogWriter,
    Lookup,
    fingerprints,
    request_scope,
)
from histate_vllm.bookkeeping.telemetry import Telemetry, summary
from histate_vllm.vllm_glue.prom_metrics import to_stats

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply


class Observer:
    GAUGE_INTERVAL = 1.0  # seconds between scans of the entries for the gauges

    def __init__(self, manager):
        self.layout = manager.layout
        self.config = manager.config
        self.store = manager.store
        self.orch = manager.orch
        self.policy = manager.policy
        self.telemetry = Telemetry(self.layout.block_tokens, time.monotonic)
        self._loading: dict[str, list[bytes]] = {}  # request -> keys of its load in flight
        self.orch.on_events = self._on_policy_events
        self._gauges_at = float("-inf")
        self._orch_counts_seen: dict[str, int] = {}
        self._fleet_seen: dict = {}
        self._fleet_lock = threading.Lock()  # the summary thread counts too
        self.manager = manager
        self._other_stores = self._sibling_stores()
        log_dir = self.config.event_log_dir
        if log_dir is None and self.store is not None:
            log_dir = os.path.join(self.store.layout.dir, "events")
        self.event_log: EventLogWriter | None = None
        if log_dir is not None:
            try:
                self.event_log = EventLogWriter(log_dir, max_bytes=self.config.event_log_bytes)
            except OSError as exc:
                logger.warning("HiState: no event log in %s: %s", log_dir, exc)
        self._stop = threading.Event()
        if self.config.summary_interval:
            # A thread, so the last burst before an idle spell is reported too.
            threading.Thread(target=self._summary_loop, name="histate-summary",
                             daemon=True).start()
        # Operators (and the server test) read the real block size from this line.
        logger.info("HiState: %d-token blocks, %d bytes per key, %d DRAM slots, SSD %s, "
                    "event log %s", self.layout.block_tokens, self.layout.key_bytes,
                    manager.num_slots, self.store.root if self.store is not None else "off",
                    log_dir or "off")

    # --- hooks ---

    def _on_policy_events(self, events) -> None:
        entries = self.orch.entries
        self.telemetry.on_events(events, lambda k: k not in entries)
        if self.event_log is not None:
            self.event_log.append(events=events)

    def lookup(self, request, block_hashes: Callable[[], list[bytes]], hit_tokens: int,
               gpu_tokens: int, limit: int | None = None) -> None:
        """Once per request: was anything cached past where it resumes, and why not used.
        `limit`: the depth the restore was cut to, to fit the free GPU blocks."""
        rid = request.request_id
        if self.telemetry.looked_up(rid):
            return
        bt = self.layout.block_tokens
        hashes = block_hashes()
        hit = self.policy.restorable(hashes) if hashes else None
        shared = hit.shared if hit is not None else 0
        usable = (request.num_prompt_tokens - 1) // bt * bt
        miss = self.telemetry.lookup(rid, hashes, hit_tokens, usable, shared, self._writing,
                                     self._elsewhere if self._other_stores else None,
                                     restorable=hit.position if hit is not None else 0,
                                     limit=limit)
        if self.event_log is not None:
            self.event_log.append(lookups=[Lookup(
                t=time.time(), request_id=rid, prompt_tokens=request.num_prompt_tokens,
                block_tokens=bt, covered=hit_tokens, gpu=gpu_tokens,
                position=hit.position if hit is not None else 0, shared=shared,
                cause=miss[0] if miss else "", missed=miss[1] if miss else 0,
                fps=fingerprints(request.prompt_token_ids or [], bt, len(hashes),
                                 seed=request_scope(request)),
                nodes=hashes,
            )])

    def load_issued(self, request_id: str, keys: Sequence[bytes], slots: Sequence[int]
                    ) -> None:
        """Restored tokens per tier: each block of the load counts under the slowest tier
        one of its keys is read from (slot -1: SSD)."""
        tier_at: dict[int, str] = {}
        nbytes: Counter = Counter()
        entries = self.orch.entries
        ahead = 0
        for key, slot in zip(keys, slots):
            entry = entries[key]
            nbytes["ssd" if slot < 0 else "dram"] += entry.nbytes
            ahead += slot < 0 and entry.ahead
            if tier_at.get(entry.position) != "ssd":
                tier_at[entry.position] = "ssd" if slot < 0 else "dram"
        bt = self.layout.block_tokens
        per_tier = Counter(tier_at.values())
        self.telemetry.load_issued(request_id, {t: n * bt for t, n in per_tier.items()},
                                   dict(nbytes))
        self._loading[request_id] = list(keys)
        if ahead:
            self.telemetry.add("ssd_states_ahead_read", ahead)

    def load_failed(self, request_ids: Iterable[str], lost: Collection[bytes]) -> None:
        for rid in request_ids:
            keys = self._loading.get(rid, ())
            cause = "corrupt" if any(k in lost for k in keys) else "load_failed"
            self.telemetry.load_failed([rid], cause)

    def load_done(self, request_id: str) -> None:
        self._loading.pop(request_id, None)
        self.telemetry.load_done(request_id)

    def request_finished(self, request_id: str) -> None:
        self._loading.pop(request_id, None)
        self.telemetry.request_finished(request_id)

    def ssd_writes_issued(self, writes) -> None:
        self.telemetry.add("ssd_writes", len(writes))
        ahead = sum(w.ahead for w in writes)
        if ahead:
            self.telemetry.add("ssd_states_ahead", ahead)

    def ssd_written(self, results: dict[bytes, bool]) -> None:
        """Before the orchestrator applies them: count writes that did not land."""
        entries = self.orch.entries
        dropped = sum(1 for k, ok in results.items()
                      if not ok and (e := entries.get(k)) is not None and e.ssd_pending)
        self.telemetry.add("ssd_writes_dropped", dropped)

    # --- miss evidence ---

    def _writing(self, node: bytes) -> bool:
        """A key of this block is admitted but its write has not landed."""
        entries = self.orch.entries
        for g in self.layout.group_ids:
            e = entries.get(node + g.to_bytes(4, "big"))
            if e is not None and not e.readable:
                return True
        return False

    def _sibling_stores(self) -> list[str]:
        """Identity directories of other engines (model, dtype, layout) under ssd_dir."""
        if self.store is None:
            return []
        root, own = self.store.root, self.store.layout.dir
        try:
            dirs = [e.path for e in os.scandir(root) if e.is_dir() and e.path != own]
        except OSError:
            return []
        return [d for d in dirs if os.path.isdir(os.path.join(d, "manifests"))]

    def _elsewhere(self, nodes: Sequence[bytes]) -> bool:
        """A checkpoint at one of the deepest of these blocks exists under another identity
        (a few stat calls, on a miss only)."""
        from histate_vllm.store.layout import Layout

        groups = sorted(self.layout.state_group_ids)
        for d in self._other_stores:
            other = Layout(os.path.dirname(d), os.path.basename(d))
            for node in nodes[-4:]:
                for g in groups:
                    if os.path.exists(other.manifest_path(node + g.to_bytes(4, "big"))):
                        return True
        return False

    # --- output ---

    def _measure(self) -> dict:
        """Gauges from the books: bytes and entries per tier, SSD writes in flight."""
        nbytes = {"dram": 0, "ssd": 0}
        count = {(t, k): 0 for t in ("dram", "ssd") for k in ("kv", "state")}
        queue = 0
        # The summary thread reads the books too: copy the entries at once (one C call).
        for e in list(self.orch.entries.values()):
            kind = "state" if e.is_state else "kv"
            if e.slot >= 0 and e.dram_ready:
                nbytes["dram"] += e.nbytes
                count[("dram", kind)] += 1
            if e.on_ssd:
                nbytes["ssd"] += e.nbytes
                count[("ssd", kind)] += 1
            queue += e.ssd_pending
        queue += self.orch.ssd_waiting()
        if self.store is None:
            del nbytes["ssd"], count[("ssd", "kv")], count[("ssd", "state")]
        gauges = {("bytes", (t,)): v for t, v in nbytes.items()}
        gauges.update({("entries", tk): v for tk, v in count.items()})
        gauges[("ssd_write_queue", ())] = queue
        return gauges

    def get_stats(self, force: bool = False):
        """Counts since the last call, and the gauges at most once per GAUGE_INTERVAL (or
        now, `force`)."""
        now = time.monotonic()
        gauges = {}
        if force or now - self._gauges_at >= self.GAUGE_INTERVAL:
            gauges, self._gauges_at = self._measure(), now
        self._count_orch_counters()
        self._count_fleet()
        delta, samples = self.telemetry.take()
        return to_stats(delta, samples, gauges)

    _SHORTFALLS = (("slot_freed_copy", "freed_copy"), ("slot_shed", "shed"),
                   ("slot_short", "refused"))

    def _count_orch_counters(self) -> None:
        """The orchestrator's slot and promotion counters (cumulative) as telemetry
        increments."""
        stats, seen = self.orch.stats, self._orch_counts_seen
        for stat, outcome in self._SHORTFALLS:
            n = stats.get(stat, 0)
            self.telemetry.add("slot_shortfalls", n - seen.get(stat, 0), (outcome,))
            seen[stat] = n
        n = stats.get("promoted", 0)
        self.telemetry.add("promoted_chunks", n - seen.get("promoted", 0))
        seen["promoted"] = n

    def _count_fleet(self) -> None:
        """The fleet link's and tiers' counters (cumulative, kept by their threads) as
        telemetry increments."""
        fleet = self.manager.fleet
        if fleet is None:
            return
        now: dict = {}
        for (op, outcome), n in dict(fleet.counts).items():
            if outcome == "bytes":
                now["fleet_bytes", ("pulled" if op == "pull" else "published",)] = n
            else:
                now["fleet_ops", (op, outcome)] = n
        for tier in fleet.tiers:
            for (op, outcome), n in dict(tier.counts).items():
                if op in ("publish", "restore"):
                    key = ("fleet_ops", (op, outcome))
                    now[key] = now.get(key, 0) + n
        with self._fleet_lock:
            seen, self._fleet_seen = self._fleet_seen, now
            for (name, labels), n in now.items():
                if n != seen.get((name, labels), 0):
                    self.telemetry.add(name, n - seen.get((name, labels), 0), labels)

    def _summary_loop(self) -> None:
        while not self._stop.wait(self.config.summary_interval):
            self.log_summary()

    def log_summary(self) -> str | None:
        """Log (and return) the INFO line for the counts since the last one; None, and
        nothing logged, when nothing happened (background SSD copies alone do not count)."""
        self._count_fleet()
        window = self.telemetry.window()
        if not window or {name for name, _ in window} <= {"ssd_writes", "ssd_states_ahead"}:
            return None
        g = self._measure()
        gauges = {"DRAM MiB": round(g[("bytes", ("dram",))] / 2**20, 1)}
        if self.store is not None:
            gauges["SSD MiB"] = round(g[("bytes", ("ssd",))] / 2**20, 1)
            gauges["SSD queue"] = g[("ssd_write_queue", ())]
        line = summary(window, gauges)
        logger.info(line)
        return line

    def shutdown(self) -> None:
        self._stop.set()
        if self.event_log is not None:
            self.event_log.close()
