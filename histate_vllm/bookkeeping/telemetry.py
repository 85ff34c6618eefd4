"""What the cache did, counted where each decision is made (no vllm, no torch).

The manager feeds this from real outcomes: the policy's drained events (evictions,
demotions, losses), its lookups (`restorable`), the loads it issued and how they ended,
the SSD writes the worker reported. `take()` hands the counts accumulated since the last
call to vLLM's stats channel (vllm_glue/prom_metrics.py); `summary()` renders the INFO line.

Miss causes, decided per request from the deepest evidence past what was restored:
  writing        a key of a block past the hit is admitted but its write has not landed
  evicted        a copy there was evicted by the policy (and no copy is left)
  corrupt        a copy there was found corrupt or missing on SSD (quarantined)
  write_failed   its SSD write failed or was dropped (queue full)
  load_failed    the restore itself failed for another reason (I/O error, timeout)
  incompatible   a checkpoint there exists on disk under another store identity
  gpu_full       a checkpoint past the hit was restorable, but the restore was cut to what
                 fits the free GPU blocks (restore_admission.py); the rest was prefilled
  no_checkpoint  the KV is shared past the hit, but no checkpoint was ever kept there
A prompt with nothing cached past its hit is not a miss (first sight of that prefix).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence

from histate_vllm.policy import Tier
from histate_vllm.policy import events as ev

TIER = {Tier.DRAM: "dram", Tier.SSD: "ssd"}
CAUSES = ("no_checkpoint", "gpu_full", "evicted", "corrupt", "write_failed", "load_failed",
          "incompatible", "writing")
MAX_FATES = 1 << 16  # nodes whose last loss is remembered for miss causes

Labels = tuple[str, ...]


def reason_label(reason: str) -> str:
    """A bounded label from a policy reason: its words before any ':' or number."""
    head = reason.split(":", 1)[0]
    head = re.sub(r"[^a-z]+", "_", head.lower()).strip("_")
    return head[:48] or "unspecified"


def _loss_cause(e: ev.Event) -> str | None:
    if e.op == ev.EVICT:
        return "evicted"
    if e.op == ev.REMOVE:
        r = e.reason.lower()
        return "corrupt" if ("corrupt" in r or "missing" in r) else "evicted"
    if e.op == ev.FAIL and e.tier == Tier.SSD:
        return "write_failed"
    return None


class Telemetry:
    def __init__(self, block_tokens: int, clock: Callable[[], float]):
        self.block_tokens = block_tokens
        self.clock = clock
        self._delta: dict[tuple[str, Labels], float] = defaultdict(float)  # for take()
        self._window: dict[tuple[str, Labels], float] = defaultdict(float)  # for summary()
        self._samples: dict[tuple[str, Labels], list[float]] = defaultdict(list)
        self._fate: OrderedDict[bytes, str] = OrderedDict()  # node -> cause of its last loss
        # request -> (issue time, {tier: tokens}) of its loads not yet completed
        self._loads: dict[str, tuple[float, dict[str, int]]] = {}
        self._failed: dict[str, str] = {}  # request -> miss cause of its failed load
        self._looked_up: set[str] = set()
        self._lock = threading.Lock()  # window() is read by the summary thread

    # --- counting ---

    def add(self, name: str, value: float = 1, labels: Labels = ()) -> None:
        if value:
            self._delta[(name, labels)] += value
            with self._lock:
                self._window[(name, labels)] += value

    def observe(self, name: str, value: float, labels: Labels = ()) -> None:
        self._samples[(name, labels)].append(value)

    def take(self) -> tuple[dict[tuple[str, Labels], float], dict[tuple[str, Labels], list]]:
        """Counter increments and histogram samples since the last call."""
        delta, self._delta = dict(self._delta), defaultdict(float)
        samples, self._samples = dict(self._samples), defaultdict(list)
        return delta, samples

    def window(self) -> dict[tuple[str, Labels], float]:
        """Counts since the last call (the summary line's period)."""
        with self._lock:
            out, self._window = dict(self._window), defaultdict(float)
        return out

    # --- policy events ---

    def on_events(self, events: Iterable[ev.Event], gone: Callable[[bytes], bool]) -> None:
        """Evictions and demotions by tier and reason; remember each node's last loss.
        `gone(key)`: no copy of the key is left (a copy dropped in one tier may live on)."""
        fate = self._fate
        for e in events:
            if e.op in (ev.EVICT, ev.DEMOTE) and e.tier is not None:
                name = "evictions" if e.op == ev.EVICT else "demotions"
                self.add(name, 1, (TIER.get(e.tier, e.tier.name.lower()),
                                   reason_label(e.reason)))
            cause = _loss_cause(e)
            if cause is not None and e.node and gone(e.key):
                fate[e.node] = cause
                fate.move_to_end(e.node)
                if len(fate) > MAX_FATES:
                    fate.popitem(last=False)

    # --- lookups ---

    def looked_up(self, request_id: str) -> bool:
        return request_id in self._looked_up

    def lookup(
        self,
        request_id: str,
        block_hashes: Sequence[bytes],
        covered: int,
        usable: int,
        shared: int,
        writing: Callable[[bytes], bool],
        elsewhere: Callable[[Sequence[bytes]], bool] | None = None,
        restorable: int = 0,
        limit: int | None = None,
    ) -> tuple[str, int] | None:
        """Once per request: (cause, tokens missed) when something cached past `covered`
        (the tokens vLLM resumes from) could have served it, else None.

        usable: the prompt's last block boundary vLLM may resume from; shared: tokens whose
        KV the policy holds (its `restorable` lookup), restorable: its deepest checkpoint
        there; limit: the depth the restore was cut to (free GPU blocks), if it was."""
        if request_id in self._looked_up:
            return None
        self._looked_up.add(request_id)
        self.add("lookups")
        bt = self.block_tokens
        first, last = covered // bt + 1, min(usable // bt, len(block_hashes))
        miss = None
        reach = min(restorable, usable)
        if limit is not None and reach > covered and reach > limit:
            miss = ("gpu_full", reach - covered)  # the policy had it: the cut decided
        else:
            miss = self._evidence(block_hashes, covered, first, last, writing)
        if miss is None and min(shared, usable) > covered:
            miss = ("no_checkpoint", min(shared, usable) - covered)
        if miss is None and elsewhere is not None and last >= first:
            if elsewhere(block_hashes[first - 1 : last]):
                miss = ("incompatible", last * bt - covered)
        if miss is not None:
            self.add("misses", 1, (miss[0],))
            self.add("missed_tokens", miss[1], (miss[0],))
        return miss

    def _evidence(self, block_hashes, covered: int, first: int, last: int,
                  writing: Callable[[bytes], bool]) -> tuple[str, int] | None:
        """The deepest block past the hit whose copy is being written or was lost."""
        bt = self.block_tokens
        for b in range(last, first - 1, -1):
            node = block_hashes[b - 1]
            if writing(node):
                return "writing", b * bt - covered
            if node in self._fate:
                return self._fate[node], b * bt - covered
        return None

    # --- loads ---

    def load_issued(self, request_id: str, tiers: dict[str, int],
                    nbytes: dict[str, int] | None = None) -> None:
        """A load job for the request: restored tokens (and bytes read) per tier, counted
        when it lands."""
        t0, acc, acc_bytes = self._loads.get(request_id, (self.clock(), {}, {}))
        for tier, n in tiers.items():
            acc[tier] = acc.get(tier, 0) + n
        for tier, n in (nbytes or {}).items():
            acc_bytes[tier] = acc_bytes.get(tier, 0) + n
        self._loads[request_id] = (t0, acc, acc_bytes)

    def load_failed(self, request_ids: Iterable[str], cause: str = "corrupt") -> None:
        self._failed.update((r, cause) for r in request_ids if r in self._loads)

    def load_done(self, request_id: str) -> None:
        """The request's loads completed (vLLM's complete_load)."""
        item = self._loads.pop(request_id, None)
        if item is None:
            return
        t0, tiers, nbytes = item
        tokens = sum(tiers.values())
        cause = self._failed.pop(request_id, None)
        if cause is not None:
            self.add("misses", 1, (cause,))  # vLLM recomputes it all
            self.add("missed_tokens", tokens, (cause,))
            return
        slowest = "ssd" if tiers.get("ssd") else "dram"
        self.observe("restore_seconds", self.clock() - t0, (slowest,))
        for tier, n in tiers.items():
            self.add("restored_tokens", n, (tier,))
        for tier, n in nbytes.items():
            self.add("restored_bytes", n, (tier,))
        self.add("restores", 1, (slowest,))

    def request_finished(self, request_id: str) -> None:
        self._looked_up.discard(request_id)
        self._loads.pop(request_id, None)
        self._failed.pop(request_id, None)


def summary(window: dict[tuple[str, Labels], float], gauges: dict[str, float]) -> str | None:
    """One line for the INFO log, or None when nothing happened in the window."""
    if not window:
        return None

    def total(name: str) -> int:
        return int(sum(v for (n, _), v in window.items() if n == name))

    def by(name: str) -> str:
        parts = sorted((lab[0], int(v)) for (n, lab), v in window.items() if n == name and lab)
        return ",".join(f"{k}={v}" for k, v in parts) or "0"

    misses = total("misses")
    line = (f"HiState: {total('lookups')} lookups, restored tokens {by('restored_tokens')}, "
            f"{misses} misses" + (f" ({by('misses')})" if misses else ""))
    line += f", {total('evictions')} evictions, {total('demotions')} demotions"
    dropped = total("ssd_writes_dropped")
    if dropped:
        line += f", {dropped} SSD writes dropped"
    promoted = total("promoted_chunks")
    if promoted:
        line += f", {promoted} KV chunks read from SSD kept in DRAM"
    fleet = {lab: int(v) for (n, lab), v in window.items() if n == "fleet_ops" and v}
    if fleet:
        line += ", fleet tier " + ",".join(f"{op}:{out}={v}"
                                            for (op, out), v in sorted(fleet.items()))
    short = total("slot_shortfalls")
    if short:
        line += f", {short} keys short of a DRAM slot ({by('slot_shortfalls')})"
    if gauges:
        line += "; " + ", ".join(f"{k} {v:g}" for k, v in gauges.items())
    return line
