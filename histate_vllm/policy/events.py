"""Policy events (msgspec, so they cross processes and land in logs) and the miss explainer.

Every admission, rejection, demotion, eviction, removal, plan and lookup miss is one `Event`
with its reason. `explain` replays the events of one prompt's nodes to answer "why was
there no checkpoint at position P".
"""

from __future__ import annotations

from collections import OrderedDict, deque

import msgspec

from .types import Kind, Tier

# Event.op values
ADMIT = "admit"  # accepted for writing into `tier` (pending until committed)
REJECT = "reject"  # offered but not accepted; reason says why
COMMIT = "commit"  # write finished
FAIL = "fail"  # write failed, residency forgotten
EVICT = "evict"  # the manager was told to drop this copy to make room
DEMOTE = "demote"  # a copy dropped from a fast tier because a slower one holds it
REMOVE = "remove"  # the manager reported the copy lost
RESTORE = "restore"  # re-populated at start-up from a persistent index
PLAN = "plan"  # capture positions planned for a request (key empty)
MISS = "miss"  # lookup found less than the shared prefix (position = restorable depth)
HIT = "hit"  # a restore used a checkpoint


class Event(msgspec.Struct, kw_only=True, omit_defaults=True):
    op: str
    t: float
    reason: str = ""
    key: bytes = b""
    node: bytes = b""
    tier: Tier | None = None
    kind: Kind | None = None
    position: int = -1
    request_id: str = ""
    positions: list[int] = []
    # GDS score of the unit at the time of the decision, when one applies.
    score: float | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[Event])


def encode_events(events: list[Event]) -> bytes:
    return _encoder.encode(events)


def decode_events(data: bytes) -> list[Event]:
    return _decoder.decode(data)


class EventLog:
    """Undrained events (for `drain_events`) plus a bounded ring of recent ones (`explain`).

    The ring is scanned only by `explain` (rare); emitting is two appends.
    """

    def __init__(self, clock, history: int = 200_000, max_pending: int = 1_000_000):
        self._clock = clock
        self._pending: list[Event] = []
        self._ring: deque[Event] = deque(maxlen=history)
        self._plans: OrderedDict[str, Event] = OrderedDict()
        self._max_pending = max_pending
        self.dropped = 0  # events lost because nobody drained them
        self.enabled = True

    def emit(self, op: str, key: bytes = b"", node: bytes = b"", tier: Tier | None = None,
             kind: Kind | None = None, position: int = -1, reason: str = "",
             request_id: str = "", positions: list[int] | None = None,
             score: float | None = None) -> Event | None:
        if not self.enabled:
            return None
        ev = Event(op=op, t=self._clock(), reason=reason, key=key, node=node, tier=tier,
                   kind=kind, position=position, request_id=request_id,
                   positions=positions if positions is not None else [], score=score)
        pending = self._pending
        pending.append(ev)
        if len(pending) > self._max_pending:  # nobody drains: keep the newest half
            self.dropped += len(pending) // 2
            del pending[: len(pending) // 2]
        self._ring.append(ev)
        if op == PLAN and request_id:
            self._plans[request_id] = ev
            if len(self._plans) > 4096:
                self._plans.popitem(last=False)
        return ev

    def drain(self) -> list[Event]:
        out, self._pending = self._pending, []
        return out

    def history(self, node: bytes, limit: int = 32) -> list[Event]:
        out = [e for e in self._ring if e.node == node]
        return out[-limit:]

    def plans(self) -> list[Event]:
        return list(self._plans.values())
