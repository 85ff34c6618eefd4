"""The store identity changes with everything that changes the bytes of a KV page or a
state, or the keys: each field is changed here and must move entries to another store."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from histate_vllm.vllm_glue.identity import check_parallelism, store_identity, store_root
from histate_vllm.vllm_glue.layout import CacheLayout

LAYOUT = CacheLayout(group_ids=(0, 1), state_group_ids=frozenset({1}), key_bytes=4096,
                     block_tokens=256)


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 64}')
    (d / "model.safetensors").write_bytes(b"w" * 100)
    return d


def config(model_dir, **over):
    model = dict(model=str(model_dir), dtype="bfloat16", revision=None, hf_overrides={},
                 quantization=None, quantization_config=None)
    cache = dict(cache_dtype="auto", mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto",
                 prefix_caching_hash_algo="sha256")
    parallel = dict(rank=0, tensor_parallel_size=1, pipeline_parallel_size=1,
                    prefill_context_parallel_size=1, decode_context_parallel_size=1,
                    data_parallel_size=1, data_parallel_rank=0)
    load = dict(load_format="auto")
    for key, value in over.items():
        section, _, name = key.partition("__")
        {"model": model, "cache": cache, "parallel": parallel, "load": load}[section][name] = value
    return SimpleNamespace(model_config=SimpleNamespace(**model),
                           cache_config=SimpleNamespace(**cache),
                           parallel_config=SimpleNamespace(**parallel),
                           load_config=SimpleNamespace(**load))


def digest(cfg, layout=LAYOUT) -> str:
    return store_identity(cfg, layout).digest()


@pytest.mark.parametrize("change", [
    dict(model__dtype="float16"),
    dict(cache__cache_dtype="fp8"),
    dict(cache__mamba_ssm_cache_dtype="float32"),
    dict(cache__mamba_cache_dtype="float32"),
    dict(model__quantization="fp8"),
    dict(model__quantization_config={"bits": 4}),
    dict(model__hf_overrides={"rope_theta": 1e6}),
    dict(model__revision="abc123"),
    dict(cache__prefix_caching_hash_algo="sha256_cbor"),
    dict(parallel__rank=1),
    dict(parallel__tensor_parallel_size=2),
    dict(parallel__decode_context_parallel_size=2),
])
def test_each_setting_changes_the_identity(model_dir, change):
    assert digest(config(model_dir, **change)) != digest(config(model_dir))


@pytest.mark.parametrize("layout", [
    CacheLayout((0, 1), frozenset({1}), 8192, 256),  # page bytes
    CacheLayout((0, 1), frozenset({1}), 4096, 512),  # block tokens
    CacheLayout((0, 1, 2), frozenset({1}), 4096, 256),  # groups
    CacheLayout((0, 1), frozenset({0}), 4096, 256),  # which groups hold states
])
def test_block_layout_changes_the_identity(model_dir, layout):
    assert digest(config(model_dir), layout) != digest(config(model_dir))


def test_same_settings_same_identity(model_dir):
    assert digest(config(model_dir)) == digest(config(model_dir))


def test_rebuilt_weights_change_the_identity(model_dir):
    before = digest(config(model_dir))
    (model_dir / "model.safetensors").write_bytes(b"v" * 100)  # same size, new mtime
    os.utime(model_dir / "model.safetensors", ns=(1, 1))
    assert digest(config(model_dir)) != before
    (model_dir / "config.json").write_text('{"hidden_size": 65}')
    assert digest(config(model_dir)) != before


def test_new_weights_with_the_old_size_and_mtime_change_the_identity(model_dir, tmp_path):
    """Weights rewritten in place, keeping size and mtime (cp -p, rsync -t, a reproducible
    image): the identity follows the bytes, with or without the digest cache."""
    f = model_dir / "model.safetensors"
    cache = str(tmp_path / "ssd")
    before = store_identity(config(model_dir), LAYOUT, weights_cache_dir=cache).digest()
    st = f.stat()
    f.write_bytes(b"v" * st.st_size)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    after = store_identity(config(model_dir), LAYOUT, weights_cache_dir=cache).digest()
    assert after != before
    assert store_identity(config(model_dir), LAYOUT).digest() == after


def test_an_engine_without_ssd_reads_no_weights(model_dir, monkeypatch):
    from histate_vllm.vllm_glue import identity

    monkeypatch.setattr(identity, "files_digest", lambda *a: 1 / 0)
    ident = store_identity(config(model_dir), LAYOUT, hash_weights=False)
    assert ident.weights == "unpinned: no SSD store"


def test_hub_model_is_pinned_by_its_cached_snapshot(model_dir, monkeypatch):
    import huggingface_hub

    snapshots = {"main": model_dir}
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, revision=None, local_files_only=False:
                        str(snapshots[revision or "main"]))
    ident = store_identity(config(model_dir, model__model="org/hub-model"), LAYOUT)
    assert ident.model == "org/hub-model" and not ident.weights.startswith("unpinned")
    (model_dir / "model.safetensors").write_bytes(b"x" * 10)
    assert store_identity(config(model_dir, model__model="org/hub-model"), LAYOUT) != ident


@pytest.mark.parametrize("change, why", [
    (dict(model__model="org/not-downloaded"), "not found on local disk"),
    (dict(model__hf_overrides=lambda c: c), "hf_overrides is a function"),
    (dict(load__load_format="dummy"), "dummy weights"),
])
def test_weights_that_cannot_be_pinned_are_marked(model_dir, change, why, monkeypatch):
    import huggingface_hub

    def not_cached(*a, **k):
        raise FileNotFoundError("not in the cache")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_cached)
    weights = store_identity(config(model_dir, **change), LAYOUT).weights
    assert weights.startswith("unpinned: ") and weights.endswith(why)


def test_data_parallel_engines_get_their_own_directory(model_dir):
    assert store_root(None, config(model_dir)) is None
    assert store_root("/ssd", config(model_dir)) == "/ssd"
    cfg = config(model_dir, parallel__data_parallel_size=2, parallel__data_parallel_rank=1)
    assert store_root("/ssd", cfg) == "/ssd/dp1"


@pytest.mark.parametrize("name", ["pipeline_parallel_size", "prefill_context_parallel_size"])
def test_unsupported_parallelism_is_refused(model_dir, name):
    with pytest.raises(ValueError, match=f"{name}=2"):
        check_parallelism(config(model_dir, **{f"parallel__{name}": 2}))
    check_parallelism(config(model_dir))


# --- layout, backend, hash seed, --download-dir ---


def test_kv_cache_layout_changes_the_identity(model_dir):
    cfg = config(model_dir)
    nhd = store_identity(cfg, LAYOUT, SimpleNamespace(kv_cache_layout="NHD")).digest()
    hnd = store_identity(cfg, LAYOUT, SimpleNamespace(kv_cache_layout="HND")).digest()
    assert nhd != hnd
    # Without a kv_cache_config (e.g. tools), the cache config's resolved layout counts.
    cfg.cache_config.kv_cache_layout = "HND"
    assert store_identity(cfg, LAYOUT).digest() == hnd


def test_attention_backend_changes_the_identity(model_dir):
    cfg = config(model_dir)
    before = digest(cfg)
    cfg.attention_config = SimpleNamespace(backend="FLASHINFER")
    assert digest(cfg) != before


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_random_hash_seed_marks_the_store_unpinned(model_dir, monkeypatch, algo):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    weights = store_identity(config(model_dir, cache__prefix_caching_hash_algo=algo),
                             LAYOUT).weights
    assert weights.startswith("unpinned: ") and "PYTHONHASHSEED" in weights
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert not store_identity(config(model_dir, cache__prefix_caching_hash_algo=algo),
                              LAYOUT).weights.startswith("unpinned")


def test_sha256_needs_no_hash_seed(model_dir, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert not store_identity(config(model_dir), LAYOUT).weights.startswith("unpinned")


def test_download_dir_is_where_a_hub_model_is_found(model_dir, monkeypatch):
    import huggingface_hub

    def snapshot(repo, revision=None, local_files_only=False, cache_dir=None):
        if cache_dir != "/models":
            raise FileNotFoundError("not in the default cache")
        return str(model_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    ident = store_identity(config(model_dir, model__model="org/hub-model",
                                  load__download_dir="/models"), LAYOUT)
    assert not ident.weights.startswith("unpinned"), ident.weights
