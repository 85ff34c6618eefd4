"""The contract every policy implements (`histate` and the `lru` ablation).

Callers: the vLLM connector's offloading manager and the trace simulator. Neither the
contract nor any implementation touches vllm, torch, files or the wall clock (the clock is
injected). Residency is tracked per (key, tier); GPU residency is only observed.

Lifecycle of a copy: `admit` -> pending (counts against the budget, not hit-able) ->
`committed(ok=True)` -> resident (hit-able) -> dropped by the manager after the policy names
it in an `Admission.evict`, in `demotions`, or after `remove`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from .events import Event
from .types import Admission, Hit, Item, Tier


class PolicyCore(ABC):
    # True: a checkpoint may be written to SSD ahead of the KV chunks before it (see
    # Evictor.states_lead; the store keeps such a state for this process only).
    states_lead = False

    @abstractmethod
    def where(self, key: bytes) -> frozenset[Tier]:
        """Tiers holding a committed copy of `key` (pending writes excluded)."""

    @abstractmethod
    def admit(self, items: Sequence[Item], tier: Tier) -> Admission | None:
        """Decide which of `items` to write into `tier` and what to drop first.

        KV items are taken before STATE items (each by position). Left out of `accepted`,
        each with a REJECT event and reason: a key already held (or pending) in `tier`
        (silently), a STATE at a position the request's capture plan does not include (unless
        `terminal`), a STATE whose KV chunks before it are not all present or pending, an item
        larger than the budget, and whatever does not fit (deepest first).
        Accepted keys count against the budget at once (pending) and become hit-able only
        after `committed`. `evict` lists the (key, tier) copies the manager must drop before
        writing; the policy has already forgotten them. It may name copies in the other tier
        too (a GDS unit is deleted whole). Never a pinned key or a pending write; never the
        last copy of a KV chunk a remaining checkpoint needs; the tier never exceeds its budget.
        Returns None when nothing is accepted and nothing evicted (no state changed). If
        room could not be made after all (pinned or in-flight data), `accepted` may be empty
        while `evict` is not: apply the evictions anyway.
        `spill` (DRAM admissions, histate): keys whose DRAM copy is in `evict` but which move
        to SSD, already pending there: copy each from its DRAM copy, then `committed(key,
        SSD, ok)`; free the DRAM copy only once the copy is done. A write that cannot be
        done is reported with ok=False.
        """

    @abstractmethod
    def committed(self, key: bytes, tier: Tier, ok: bool) -> None:
        """A write admitted earlier finished (`ok`) or failed (that copy is forgotten; if it
        was a KV chunk's last copy, the checkpoints that needed it go to `demotions`)."""

    @abstractmethod
    def keep(self, key: bytes, tier: Tier) -> bool:
        """Ask after a key's copy in a slower tier committed: should the copy in `tier` stay?

        KV chunks and terminal (leaf) checkpoints stay in DRAM; historical checkpoints do
        not. False means the policy has already forgotten that copy: drop it. Unknown key:
        False. Pinned, pending or not-yet-backed copies: True (asked again via `demotions`).
        """

    @abstractmethod
    def demotions(self, tier: Tier) -> list[bytes]:
        """Keys whose copy in `tier` the manager should drop now (already forgotten here):
        DRAM copies of checkpoints that stopped being terminal once SSD holds them, and
        checkpoints made useless by a lost KV chunk (a named copy may still be in flight: drop
        it when its write lands). Poll it after commits and after `remove`."""

    @abstractmethod
    def pin(self, keys: Iterable[bytes]) -> None:
        """Being loaded: never evicted or demoted until the matching `unpin`. Counted."""

    @abstractmethod
    def unpin(self, keys: Iterable[bytes]) -> None: ...

    @abstractmethod
    def pinned(self, key: bytes) -> int:
        """How many pins the key holds now (loads and SSD writes reading its copies)."""

    @abstractmethod
    def hit(self, keys: Iterable[bytes], copies: bool = True) -> None:
        """A restore used these keys (KV chunks and the checkpoint): refresh recency.
        copies=False: the GPU served them (HiState: its copies still become the most recent,
        but its reuse interval learns nothing; LRU: nothing changes, as in vLLM)."""

    @abstractmethod
    def remove(self, key: bytes, tier: Tier, reason: str) -> None:
        """The manager lost the copy in `tier` (corrupt file, disk error, ...). If it was a
        KV chunk's last copy, the checkpoints below it go to `demotions`."""

    @abstractmethod
    def plan_captures(
        self,
        request_id: str,
        block_hashes: Sequence[bytes],
        num_prompt_tokens: int,
        hit_tokens: int,
        boundaries: Sequence[int] = (),
    ) -> list[int]:
        """Block-aligned token positions (ascending) to take checkpoints at.

        Each is > hit_tokens, except hit_tokens itself when the reused history ended there
        without a managed checkpoint (e.g. a GPU prefix-cache hit): capture that state too.
        The plan is remembered until `request_finished`: STATE items of this request at other
        positions (and not `terminal`) are refused by `admit`, and what the request stores
        (its KV chunks, and the checkpoints it leaves on the way) is not evicted until then.
        `boundaries`: token positions known before any fork where later prompts tend to
        diverge (the end of the prompt's first message, breakpoints the client declared);
        the planner checkpoints there (planner.py).
        """

    @abstractmethod
    def restorable(
        self,
        block_hashes: Sequence[bytes],
        kv_groups: Sequence[int] | None = None,
        state_groups: Sequence[int] | None = None,
    ) -> Hit:
        """Deepest restorable position and longest shared prefix for a prompt (see `Hit`).

        No side effects: call `pin` on the keys to load, and `hit` once the restore is used.
        Groups default to the policy's (configured, or learned from admitted keys).
        """

    @abstractmethod
    def request_finished(self, request_id: str) -> None:
        """Forget the request's plan; its KV chunks become ordinary eviction candidates."""

    @abstractmethod
    def drain_events(self) -> list[Event]: ...

    @abstractmethod
    def explain(self, block_hashes: Sequence[bytes], position: int) -> str:
        """Why there is (or was) no checkpoint at `position` of this prompt."""

    @abstractmethod
    def usage(self, tier: Tier) -> int:
        """Bytes counted against `tier`: committed plus pending."""

    @abstractmethod
    def restore_resident(
        self,
        items: Sequence[Item],
        tier: Tier,
        last_access: Sequence[float] | None = None,
        now: float | None = None,
    ) -> list[bytes]:
        """Re-populate committed entries at start-up (e.g. from the SSD index).

        `last_access` (e.g. file mtimes, in any clock; `now` = that clock's present, default
        the newest of them) orders them and spaces them in time; without it the order of
        `items` is oldest first. Restored data ranks older than anything admitted after the
        restart. Emits RESTORE events, never ADMIT. Returns the keys of `tier` that do not fit
        its budget or lack the KV chunks before them: the manager should delete them.
        """

    @abstractmethod
    def set_budget(self, tier: Tier, nbytes: int) -> list[tuple[bytes, Tier]]:
        """Change a tier's byte budget; returns the (key, tier) copies to drop to fit it."""

    def shed(self, tier: Tier, nbytes: int) -> list[tuple[bytes, Tier]]:
        """The manager's slots of `tier` ran out although the policy is within budget
        (copies moving to SSD hold theirs until their writes land): delete, by the
        policy's own eviction order, at least `nbytes` of what `tier` holds, never a pinned
        or pending copy nor what a request still prefilling stored. Returns the (key, tier)
        copies to drop; empty when nothing can go (the key being stored is refused)."""
        return []

    def observe_gpu(self, keys: Iterable[bytes], resident: bool) -> None:
        """Record that vLLM's GPU cache holds (or dropped) these keys. Optional."""

    def set_step_cost(self, tokens: float) -> None:
        """What one more engine step costs from now on, in tokens of prefill (the planner's
        price of a chunk end off vLLM's grid; bookkeeping/step_cost.py measures it)."""
        self.planner.step_cost_tokens = float(tokens)

    def check_invariants(self) -> None:
        """Recompute derived counters from scratch and assert they match. For tests."""
