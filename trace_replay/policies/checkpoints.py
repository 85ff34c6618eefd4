"""Where the baselines leave recurrent-state checkpoints for one request (token positions).

All positions are block-aligned, lie in (resume, prompt_end] and are sorted:
* prompt end: vLLM align mode's replay boundary / SGLang's state after prefill; the last
  block boundary before the prompt's last token (which vLLM never serves from cache);
* junction: where the request's cached KV prefix ends beyond its restorable state (vLLM's
  shared-prefix junction, Marconi's branch point): the prefill passes it, so keep its state;
* chunk ends: every prefill chunk end (vLLM align with dense retention, SGLang per chunk);
* periodic: every `interval` tokens from the prompt's start (vLLM 0.34's
  `prefix_cache_retention_interval` > 0).
"""

from __future__ import annotations


def turn_boundaries(resume: int, shared: int, prompt_end: int, block: int) -> list[int]:
    out = []
    junction = min(shared // block * block, prompt_end)
    if junction > resume and junction != prompt_end:
        out.append(junction)
    if prompt_end > resume:
        out.append(prompt_end)
    return out


def chunk_ends(resume: int, prompt_end: int, chunk: int, block: int) -> list[int]:
    step = max(block, chunk // block * block)
    return list(range(resume + step, prompt_end, step))


def periodic(resume: int, prompt_end: int, interval: int, block: int) -> list[int]:
    step = max(block, interval // block * block)
    return list(range((resume // step + 1) * step, prompt_end, step))


def merge(*lists: list[int]) -> list[int]:
    return sorted(set().union(*lists))
