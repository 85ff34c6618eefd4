"""Capture planning: where one request should leave checkpoints (design.md §2).

Always: the prompt end (vLLM keeps the last prompt token for sampling, so the last full block
boundary before it), the point where reused history ended when no managed checkpoint sits
there, a learned boundary (Gufo): the end of the longest cached prefix when it reaches
>= `learn_min_tokens` past the deepest restorable checkpoint, and the block boundary at or
before each of the prompt's boundaries, points known before any fork where later prompts
tend to diverge: the end of the prompt's first message (the system prompt and tool
definitions: agents keep that prefix and rewrite what follows it; in the shared Weka
sessions about a third of the forks into a first prompt land within five 64-token blocks
of it) and the breakpoints the client declares (the ends of the sections it marks
cacheable, as with Anthropic's `cache_control`; in the Weka sessions a new conversation of
the same agent leaves the old one where the tool definitions end, before the system prompt).
Intermediate: every I* tokens of the new segment [start, prompt end), I* from
`IntervalModel`, at most `max_intermediate` of them (thinned evenly); once internal hits
were observed (forks.py: absolute depths, and forks a few blocks before the end of the
context they left),
re-chosen greedily under a mixture of the uniform prior and those depths, as many as pay
for themselves; then, given the engine's prefill chunk, moved onto the chunk ends it takes
anyway where the engine step that saves is worth more than the recomputation it adds
(chunk_grid.py). Every position is a multiple of the block size and > the resume point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .chunk_grid import on_chunk_grid
from .forks import ForkDepths, place, prior
from .interval import IntervalModel
from .options import check_options

PROMPT_END = "prompt_end"
REUSED_END = "reused_end"
LEARNED = "learned"
BOUNDARY = "boundary"
INTERVAL = "interval"
CHUNK_END = "chunk_end"


@dataclass(slots=True)
class Plan:
    positions: list[int] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)
    interval: int = 0
    reason: str = ""


class CapturePlanner:
    def __init__(self, block_tokens: int, model: IntervalModel, learn_min_tokens: int = 512,
                 max_intermediate: int = 16, chunk_tokens: int | None = None,
                 step_cost_tokens: float = 0.0):
        """chunk_tokens: the engine's prefill chunk (its step token budget); step_cost_tokens:
        the fixed cost of one more engine step, in tokens of prefill. With both, intermediate
        checkpoints move onto the chunk ends the engine takes anyway where that costs less
        recomputation than the step it saves (chunk_grid.py)."""
        assert block_tokens > 0
        check_options({"max_intermediate": max_intermediate,
                       "learn_min_tokens": learn_min_tokens})
        self.block_tokens = block_tokens
        self.model = model
        self.learn_min_tokens = learn_min_tokens
        self.max_intermediate = max_intermediate
        self.chunk = (chunk_tokens // block_tokens * block_tokens) if chunk_tokens else 0
        self.step_cost_tokens = step_cost_tokens
        self.forks: ForkDepths | None = ForkDepths()

    def prompt_end(self, num_prompt_tokens: int) -> int:
        bt = self.block_tokens
        return max(0, (num_prompt_tokens - 1) // bt * bt)

    def plan(self, num_prompt_tokens: int, hit_tokens: int, restorable: int, shared: int,
             boundaries: Sequence[int] = ()) -> Plan:
        """`restorable`/`shared` come from the prefix index (`Hit.position` / `Hit.shared`);
        `boundaries`: token positions known before any fork where later prompts tend to
        diverge (see the module docstring)."""
        bt = self.block_tokens
        end = self.prompt_end(num_prompt_tokens)
        start = hit_tokens // bt * bt
        labels: dict[int, str] = {}
        notes: list[str] = []
        if end > start:
            labels[end] = PROMPT_END
        else:
            notes.append(f"prompt end {end} not past the resume point {start}")
        if start > 0 and start != restorable and start <= end:
            labels.setdefault(start, REUSED_END)
        for m in boundaries:
            at = m // bt * bt
            if start < at < end:
                labels.setdefault(at, BOUNDARY)
        # Where chunk ends are priced engine steps (the engine; the simulator's are free).
        priced = bool(self.chunk) and self.step_cost_tokens > 0
        step = self.step_cost_tokens if priced else 0.0
        if priced:
            # The chunk ends vLLM alone would take keep their states: they cost no step, and
            # no prompt keeps fewer than without HiState.
            for at in range(start + self.chunk, end, self.chunk):
                labels.setdefault(at, CHUNK_END)
        learned = min(shared // bt * bt, end)
        if shared - restorable >= self.learn_min_tokens and learned > start:
            labels.setdefault(learned, LEARNED)
        elif shared > restorable:
            notes.append(
                f"shared prefix {shared} is {shared - restorable} < {self.learn_min_tokens} "
                f"tokens past restorable {restorable}: no learned boundary"
            )
        interval = 0
        length = end - start
        if length > bt:
            # A checkpoint off vLLM's grid adds an engine step where steps are priced.
            interval = self.model.choose(length, step)
            points = list(range(start + interval, end, interval))
            if not self.max_intermediate:
                points = []
            elif len(points) > self.max_intermediate:
                stride = len(points) / self.max_intermediate
                points = [points[int(i * stride)] for i in range(self.max_intermediate)]
                notes.append(f"intermediate points capped at {self.max_intermediate}")
            observed: list[int] = []
            if self.forks is not None and self.model.fixed is None:
                observed = self.forks.inside(start, end)
                if observed:
                    m = self.model
                    points = place(start, end, len(points), points, observed, bt,
                                   # The uniform half of the mixture must reproduce I*: a
                                   # checkpoint pays at half what choose() charges one.
                                   min_gain=0.5 * (m.weight * m.ns_tokens + step),
                                   k_max=self.max_intermediate)
                    notes.append(f"placed for {len(observed)} observed fork depths")
            if priced and self.model.fixed is None:
                snapped = on_chunk_grid(points, list(labels), start, end, self.chunk,
                                        self.step_cost_tokens, prior(start, end, bt, observed))
                if snapped != points:
                    notes.append(f"moved onto the {self.chunk}-token chunk grid: {points} -> "
                                 f"{snapped}")
                points = snapped
            for p in points:
                labels.setdefault(p, INTERVAL)
        positions = sorted(labels)
        reason = f"segment [{start},{end}) interval {interval}"
        if notes:
            reason += "; " + "; ".join(notes)
        return Plan(positions, labels, interval, reason)
