"""Where a prompt's later versions tend to diverge, known before any fork (planner.py checkpoints
there): the end of its first message, read from the token ids, and the breakpoints its client
declares in the request's `kv_transfer_params`.

A client declares breakpoints where a section it expects to reuse ends (its tool definitions,
its system prompt), as Anthropic's `cache_control` marks them: token positions from the
prompt's first token, e.g. `"kv_transfer_params": {"histate_breakpoints": [12544, 15360]}`.
A bad value is logged and skipped, as vLLM's offloading connector treats its own request
parameters: a hint never fails a request."""

from __future__ import annotations

from vllm.logger import init_logger

logger = init_logger(f"vllm.{__name__}")

BREAKPOINTS_KEY = "histate_breakpoints"
MAX_BREAKPOINTS = 16  # a hint costs one checkpoint each: a request cannot ask for hundreds


def first_message_end(request) -> tuple[int, ...]:
    """Where the prompt's first message (system prompt and tools) ends: just past its first
    turn-end token. A chat template closes every message with one, and vLLM counts the
    model's turn-end tokens among a request's stop tokens. () when the prompt has none."""
    params = getattr(request, "sampling_params", None)
    ids = request.prompt_token_ids
    if params is None or not ids:
        return ()
    first = len(ids)
    for token in params.all_stop_token_ids:
        try:
            first = ids.index(token, 0, first)  # C-speed scan, bounded by the best so far
        except ValueError:
            pass
    return (first + 1,) if first < len(ids) else ()


def client_breakpoints(request) -> tuple[int, ...]:
    """The valid positions of `kv_transfer_params["histate_breakpoints"]` (ints in
    [1, prompt length]), at most MAX_BREAKPOINTS of them; what is skipped is logged."""
    params = getattr(request, "kv_transfer_params", None)
    raw = params.get(BREAKPOINTS_KEY) if isinstance(params, dict) else None
    if raw is None:
        return ()
    rid = getattr(request, "request_id", "?")
    if not isinstance(raw, list):
        logger.warning("HiState: request %s: %s must be a list of token positions, got %s; "
                       "ignored", rid, BREAKPOINTS_KEY, type(raw).__name__)
        return ()
    n = request.num_prompt_tokens
    good, bad = [], []
    for p in raw:
        (good if type(p) is int and 1 <= p <= n else bad).append(p)
    if bad:
        logger.warning("HiState: request %s: %s entries %s are not token positions in "
                       "[1, %d]; skipped", rid, BREAKPOINTS_KEY, bad[:4], n)
    if len(good) > MAX_BREAKPOINTS:
        logger.warning("HiState: request %s: %d %s, only the first %d are used", rid,
                       len(good), BREAKPOINTS_KEY, MAX_BREAKPOINTS)
        good = good[:MAX_BREAKPOINTS]
    return tuple(good)


def prompt_boundaries(request) -> tuple[int, ...]:
    return first_message_end(request) + client_breakpoints(request)
