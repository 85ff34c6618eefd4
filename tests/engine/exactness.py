"""How close a HiState run must be to vLLM's: vLLM's own noise, measured in the same test.

The tiny model's logits are bfloat16 and its next-token distribution nearly flat. When
only the execution changes (other prefill chunks, vLLM's own prefix cache), vLLM's float32
state differs in its last bits and a few logits round one bfloat16 step the other way: the
chosen token's logprob then moves by that step (up to 0.03 here, measured: test_history's
EDIT, vLLM alone against the cold run) and every other logprob by the same small shift of
the normaliser. A wrong recurrent state moves every logit, each by its own amount. So the
comparison looks at the top 20 tokens of each step (offline.TOP_LOGPROBS): their logprob
differences, less their median (the normaliser's shift), have a median absolute value, the
*spread*, that rounding leaves at 0 and a wrong state does not.

- Greedy tokens must be equal.
- The spread must be within twice vLLM's own (at least FLOOR, at most CAP: above CAP vLLM's
  noise is no longer small and the comparison proves nothing).
- The chosen tokens' logprobs must be within twice vLLM's own difference on them.
- A negative control (a wrong state restored on purpose) must change a greedy token or
  miss the spread tolerance by MARGIN times.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

FLOOR = 1e-4
CAP = 1e-3
MARGIN = 20


def chosen_gap(result: dict, reference: dict) -> float:
    """Largest difference of the greedy tokens' logprobs."""
    return max((abs(a - b) for a, b in zip(result["logprobs"], reference["logprobs"])),
               default=0.0)


def _same_prefix_steps(result: dict, reference: dict) -> int:
    """Steps whose inputs agree: up to and including the first differing greedy token."""
    for i, (a, b) in enumerate(zip(result["token_ids"], reference["token_ids"])):
        if a != b:
            return i + 1
    return len(result["token_ids"])


def spread(result: dict, reference: dict) -> float:
    """Largest, over steps, median |d - median(d)| of the top tokens' logprob differences d
    (over the steps whose inputs agree, when greedy tokens differ)."""
    worst = 0.0
    steps = _same_prefix_steps(result, reference)
    for top, ref in list(zip(result["top_logprobs"], reference["top_logprobs"]))[:steps]:
        common = top.keys() & ref.keys()
        if len(common) < len(ref) // 2:
            return float("inf")  # the top tokens themselves changed
        d = [top[t] - ref[t] for t in common]
        shift = statistics.median(d)
        worst = max(worst, statistics.median(abs(x - shift) for x in d))
    return worst


@dataclass(frozen=True)
class Tolerance:
    spread: float
    chosen: float

    def __str__(self) -> str:
        return f"spread {self.spread:.3g}, chosen-token logprobs {self.chosen:.3g}"


def measured_tolerance(pairs) -> Tolerance:
    """`pairs`: (run, reference run, request names) whose differences are vLLM's own noise."""
    noise_spread = noise_chosen = 0.0
    for run, ref, names in pairs:
        for name in names:
            assert run[name]["token_ids"] == ref[name]["token_ids"], (
                f"vLLM's own noise changed a greedy token of {name}")
            noise_spread = max(noise_spread, spread(run[name], ref[name]))
            noise_chosen = max(noise_chosen, chosen_gap(run[name], ref[name]))
    tol = Tolerance(max(2 * noise_spread, FLOOR), max(2 * noise_chosen, FLOOR))
    print(f"vLLM's own noise: spread {noise_spread:.3g}, chosen-token logprobs "
          f"{noise_chosen:.3g}; tolerance {tol}")
    assert tol.spread <= CAP, f"vLLM's own spread {noise_spread:.3g} puts the tolerance above {CAP}"
    return tol


def matches(result: dict, reference: dict, tol: Tolerance) -> tuple[bool, str]:
    if result["token_ids"] != reference["token_ids"]:
        return False, f"tokens {result['token_ids']} != {reference['token_ids']}"
    s, c = spread(result, reference), chosen_gap(result, reference)
    if s > tol.spread or c > tol.chosen:
        return False, f"spread {s:.3g}, chosen-token logprobs {c:.3g}: beyond {tol}"
    return True, ""


def assert_caught(result: dict, reference: dict, tol: Tolerance, what: str) -> None:
    """A negative control: a greedy token differs, or the spread misses by MARGIN x."""
    s = spread(result, reference)
    if result["token_ids"] != reference["token_ids"]:
        how = ("its top tokens changed" if s == float("inf")
               else f"spread {s:.3g} up to it, {s / tol.spread:.0f} x the tolerance")
        print(f"negative control ({what}) caught: a greedy token differs ({how})")
        return
    assert s >= MARGIN * tol.spread, (
        f"{what}: a wrong state's spread is {s:.3g}, less than {MARGIN} x the tolerance "
        f"{tol.spread:.3g}: the test cannot tell it from noise")
    print(f"negative control ({what}) caught: spread {s:.3g}, {s / tol.spread:.0f} x the "
          f"tolerance (chosen-token logprobs {chosen_gap(result, reference):.3g} apart)")


def assert_same_as_alone(run, alone, names, tol: Tolerance) -> None:
    """Requests the connector restored nothing into decode as vLLM alone's do."""
    assert names
    bad = {}
    for name in names:
        assert not run[name].get("restored"), (name, run[name])
        ok, why = matches(run[name], alone[name], tol)
        if not ok:
            bad[name] = why
    print(f"{len(names)} requests with nothing restored: {len(names) - len(bad)} as vLLM alone")
    assert not bad, f"with the connector, requests it restored nothing into differ: {bad}"
