"""The weights' content digest: any change of the bytes changes it, whatever the files'
sizes and times; each file is read once per change (the cache is keyed on what a rewrite
cannot keep); a torn or hostile cache costs a re-read, never a wrong digest."""

from __future__ import annotations

import os
import time

from histate_vllm.store.weights_digest import CACHE_FILE, file_digest, files_digest


def weights(tmp_path, content: bytes = b"A" * 4096):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text('{"hidden_size": 64}')
    f = d / "model.safetensors"
    f.write_bytes(content)
    return [d / "config.json", f]


def rewrite_keeping_size_and_mtime(path, content: bytes) -> None:
    """What an operator's `cp -p`, `rsync -t` or in-place redeploy leaves: other bytes,
    same size, same mtime."""
    st = path.stat()
    assert len(content) == st.st_size
    path.write_bytes(content)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def test_other_bytes_same_size_and_mtime_change_the_digest(tmp_path):
    files = weights(tmp_path)
    before, _ = files_digest(files, None)
    rewrite_keeping_size_and_mtime(files[1], b"B" * 4096)
    after, _ = files_digest(files, None)
    assert after != before
    rewrite_keeping_size_and_mtime(files[1], b"A" * 4096)
    assert files_digest(files, None)[0] == before  # the bytes, nothing else


def test_each_file_is_read_once_per_change(tmp_path, monkeypatch):
    from histate_vllm.store import weights_digest

    monkeypatch.setattr(weights_digest, "RACY_S", 0.0)  # files here were just written
    files = weights(tmp_path)
    cache = str(tmp_path / "ssd")
    first, r1 = files_digest(files, cache)
    assert r1.bytes_hashed == sum(f.stat().st_size for f in files) and r1.bytes_cached == 0
    again, r2 = files_digest(files, cache)
    assert again == first and r2.bytes_hashed == 0 and r2.bytes_cached == r1.bytes_hashed
    # The cache cannot be fooled by a rewrite that keeps size and mtime (ctime moves: the
    # kernel's clock for it is coarse, so not within the same few milliseconds).
    time.sleep(0.05)
    rewrite_keeping_size_and_mtime(files[1], b"C" * 4096)
    changed, r3 = files_digest(files, cache)
    assert changed != first and r3.bytes_hashed == 4096
    assert changed == files_digest(files, None)[0]


def test_a_file_changed_just_now_is_not_cached(tmp_path):
    """Its ctime could repeat on a change within the kernel's clock tick."""
    files = weights(tmp_path)
    cache = str(tmp_path / "ssd")
    files_digest(files, cache)
    assert files_digest(files, cache)[1].bytes_hashed > 0


def test_a_torn_or_hostile_cache_is_recomputed(tmp_path, monkeypatch):
    from histate_vllm.store import weights_digest

    monkeypatch.setattr(weights_digest, "RACY_S", 0.0)
    files = weights(tmp_path)
    cache = tmp_path / "ssd"
    truth, _ = files_digest(files, None)
    files_digest(files, str(cache))
    assert files_digest(files, str(cache))[1].bytes_hashed == 0  # cached
    for junk in (b"{\"trunc", b"[1, 2]", b'{"%s": 5}' % str(files[1].resolve()).encode(),
                 b'{"%s": {"stat": "x", "digest": "0"}}' % str(files[1].resolve()).encode()):
        (cache / CACHE_FILE).write_bytes(junk)
        got, report = files_digest(files, str(cache))
        assert got == truth and report.bytes_hashed > 0


def test_an_unwritable_cache_dir_still_hashes(tmp_path):
    files = weights(tmp_path)
    got, report = files_digest(files, "/dev/null/cache")
    assert got == files_digest(files, None)[0] and report.bytes_hashed > 0


def test_file_digest_reads_large_files_in_chunks(tmp_path):
    f = tmp_path / "big.bin"
    f.write_bytes(os.urandom(40 << 20))  # more than two 16 MiB chunks
    import xxhash

    assert file_digest(f) == xxhash.xxh3_128(f.read_bytes()).hexdigest()
