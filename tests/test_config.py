"""kv_connector_extra_config validation: a bad key or value stops start-up with a clear message."""

import os

import pytest

from histate_vllm.config import ConfigError, HiStateConfig


def test_minimal_and_full():
    assert HiStateConfig.from_extra_config({"dram_bytes": 1 << 20}).ssd_dir is None
    cfg = HiStateConfig.from_extra_config(
        {"dram_bytes": "1048576", "ssd_dir": "/tmp/x", "ssd_bytes": 10 << 20, "policy": "lru",
         "interval": 512}
    )
    assert (cfg.dram_bytes, cfg.ssd_bytes, cfg.policy, cfg.interval) == (
        1 << 20, 10 << 20, "lru", 512)
    assert not cfg.ssd_mirror
    assert HiStateConfig.from_extra_config({"dram_bytes": 1, "ssd_mirror": True}).ssd_mirror
    assert cfg.ssd_fsync
    assert not HiStateConfig.from_extra_config({"dram_bytes": 1, "ssd_fsync": False}).ssd_fsync
    assert cfg.step_cost_tokens == "auto"  # chunk ends priced as measured
    assert HiStateConfig.from_extra_config(
        {"dram_bytes": 1, "step_cost_tokens": 0}).step_cost_tokens == 0
    assert HiStateConfig.from_extra_config(
        {"dram_bytes": 1, "step_cost_tokens": 256}).step_cost_tokens == 256


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"dram_bytes": 1, "ssd_dri": "/x"}, "'ssd_dri'"),
        ({}, "needs 'dram_bytes'"),
        ({"dram_bytes": 0}, "'dram_bytes' must be > 0"),
        ({"dram_bytes": "lots"}, "'dram_bytes' must be an integer"),
        ({"dram_bytes": True}, "'dram_bytes' must be an integer"),
        ({"dram_bytes": 1, "policy": "fifo"}, "['histate', 'lru']"),
        ({"dram_bytes": 1, "interval": "often"}, "'interval' must be"),
        ({"dram_bytes": 1, "interval": -5}, "'interval' must be"),
        ({"dram_bytes": 1, "ssd_dir": "/tmp/x"}, "'ssd_bytes' must be a positive"),
        ({"dram_bytes": 1, "ssd_bytes": 5}, "'ssd_dir' is not"),
        ({"dram_bytes": 1, "ssd_dir": ""}, "'ssd_dir' must be a directory"),
        ({"dram_bytes": 1, "ssd_mirror": "yes"}, "'ssd_mirror' must be true or false"),
        ({"dram_bytes": 1, "ssd_fsync": 0}, "'ssd_fsync' must be true or false"),
        ({"dram_bytes": 1, "ssd_mirror": True, "policy": "lru"}, "'ssd_mirror' applies"),
        ({"dram_bytes": 1, "step_cost_tokens": -1}, "'step_cost_tokens' must be \"auto\" or"),
        ({"dram_bytes": 1, "step_cost_tokens": 1.5}, "'step_cost_tokens' must be \"auto\" or"),
        ({"dram_bytes": 1, "step_cost_tokens": "Auto"}, "'step_cost_tokens' must be \"auto\""),
    ],
)
def test_errors_name_the_key(extra, needle):
    with pytest.raises(ConfigError) as err:
        HiStateConfig.from_extra_config(extra)
    assert needle in str(err.value)


def test_unknown_key_lists_accepted_keys():
    with pytest.raises(ConfigError, match="accepted keys are .*dram_bytes.*ssd_dir"):
        HiStateConfig.from_extra_config({"dram_bytes": 1, "cpu_bytes_to_use": 5})


def test_ssd_dir_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        HiStateConfig.from_extra_config({"dram_bytes": 1, "ssd_dir": str(f), "ssd_bytes": 1})


# --- the accepted range in the message ---


def test_dram_bytes_above_the_machines_memory():
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert HiStateConfig.from_extra_config({"dram_bytes": ram}).dram_bytes == ram
    with pytest.raises(ConfigError, match=f"'dram_bytes' must be from 1 to {ram} bytes"):
        HiStateConfig.from_extra_config({"dram_bytes": ram + 1})


@pytest.mark.parametrize("ssd_bytes", [1, 10, (1 << 20) - 1])
def test_ssd_bytes_below_the_floor(ssd_bytes):
    with pytest.raises(ConfigError, match=f"at least {1 << 20} bytes .*got {ssd_bytes}"):
        HiStateConfig.from_extra_config({"dram_bytes": 1, "ssd_dir": "/tmp/x",
                                         "ssd_bytes": ssd_bytes})


@pytest.mark.parametrize("value, want", [("60", 60.0), (" 2.5 ", 2.5), (30, 30.0)])
def test_read_timeout_accepts_numeric_strings(value, want):
    cfg = HiStateConfig.from_extra_config({"dram_bytes": 1, "ssd_read_timeout_s": value})
    assert cfg.ssd_read_timeout_s == want


@pytest.mark.parametrize("value", ["soon", "0", -1, True, "inf"])
def test_read_timeout_refuses_non_positive(value):
    with pytest.raises(ConfigError, match="'ssd_read_timeout_s' must be a positive number"):
        HiStateConfig.from_extra_config({"dram_bytes": 1, "ssd_read_timeout_s": value})


SSD = {"dram_bytes": 1 << 20, "ssd_dir": "/tmp/x", "ssd_bytes": 10 << 20}


def test_the_fleet_tier_is_off_unless_asked_and_takes_either_backend():
    assert HiStateConfig.from_extra_config(SSD).fleet_backend is None
    cfg = HiStateConfig.from_extra_config(
        {**SSD, "fleet_backend": "mooncake", "fleet_master": "127.0.0.1:50051",
         "fleet_metadata_server": "http://127.0.0.1:8080/metadata",
         "fleet_lookup_timeout_s": "0.25"})
    assert (cfg.fleet_backend, cfg.fleet_protocol, cfg.fleet_lookup_timeout_s) == (
        "mooncake", "tcp", 0.25)
    cfg = HiStateConfig.from_extra_config(
        {**SSD, "fleet_backend": "dir", "fleet_dir": "/mnt/shared", "fleet_bytes": 1 << 30})
    assert (cfg.fleet_dir, cfg.fleet_bytes) == ("/mnt/shared", 1 << 30)


@pytest.mark.parametrize("extra, needle", [
    ({"fleet_dir": "/mnt/x"}, "without 'fleet_backend'"),
    ({"fleet_backend": "s3"}, "'fleet_backend' must be one of"),
    ({"fleet_backend": "dir", "fleet_dir": "/mnt/x"}, "needs ['fleet_bytes']"),
    ({"fleet_backend": "mooncake", "fleet_master": "h:1"}, "needs ['fleet_metadata_server']"),
    ({"fleet_backend": "dir", "fleet_dir": "/m", "fleet_bytes": 1, "fleet_master": "h:1"},
     "do not apply"),
    ({"fleet_backend": "mooncake", "fleet_master": "h:1", "fleet_metadata_server": "u",
      "fleet_protocol": "udp"}, "'fleet_protocol'"),
    ({"fleet_backend": "dir", "fleet_dir": "/m", "fleet_bytes": 0}, "'fleet_bytes' must be > 0"),
    ({"fleet_backend": "dir", "fleet_dir": "/m", "fleet_bytes": 1,
      "fleet_pull_timeout_s": 0}, "'fleet_pull_timeout_s'"),
])
def test_fleet_errors_name_the_key(extra, needle):
    with pytest.raises(ConfigError) as e:
        HiStateConfig.from_extra_config({**SSD, **extra})
    assert needle in str(e.value)


def test_the_fleet_tier_needs_an_ssd_store():
    with pytest.raises(ConfigError, match="needs 'ssd_dir'"):
        HiStateConfig.from_extra_config({"dram_bytes": 1, "fleet_backend": "dir",
                                         "fleet_dir": "/m", "fleet_bytes": 1})
