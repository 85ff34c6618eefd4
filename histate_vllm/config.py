"""The connector's `kv_connector_extra_config`, validated before the engine starts.

Every key is checked here, once, so a typo in a `vllm serve` command stops start-up with a
message naming the key and what is accepted, instead of silently running without a cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

POLICIES = ("histate", "lru")
# The SSD store's own files (identity, directories) before any entry: a budget below
# this holds nothing (the manager also checks one entry of the model fits: see
# vllm_glue.layout.min_ssd_bytes).
MIN_SSD_BYTES = 1 << 20


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


class ConfigError(ValueError):
    """Invalid `kv_connector_extra_config` for HiStateConnector."""


@dataclass(frozen=True)
class HiStateConfig:
    # Host memory for KV chunks and recurrent states (bytes), in total across the
    # engine's workers (each tensor-parallel rank pins its share).
    dram_bytes: int
    # Directory of the SSD checkpoint store; None disables the SSD tier.
    ssd_dir: str | None = None
    # Disk budget of the SSD store (bytes); required with ssd_dir.
    ssd_bytes: int = 0
    # "histate" (default) or "lru" (the ablation).
    policy: str = "histate"
    # "adaptive" or a fixed checkpoint interval in tokens.
    interval: str | int = "adaptive"
    # True: SSD keeps a copy of everything DRAM holds, so a restart loses nothing, and the
    # cache's capacity is SSD's alone. False: those copies are the first to give up SSD
    # space, and DRAM adds its capacity to SSD's (benchmarks/results_trace_replay.md).
    ssd_mirror: bool = False
    # Most bytes of SSD writes queued in the background before new ones are dropped.
    ssd_queue_bytes: int = 256 << 20
    # True: every SSD entry is fsynced before its manifest publishes it, so a power loss
    # keeps every published entry. False: a process crash still loses nothing published,
    # a power loss may (the next start's checksums catch what it tore); the disk's work
    # then runs in the kernel's own time (benchmarks/results_load.md).
    ssd_fsync: bool = True
    # An SSD restore not done after this many seconds is abandoned and recomputed.
    ssd_read_timeout_s: float = 60.0
    # What one more engine step costs, in tokens of prefill: a planned checkpoint between
    # the chunk ends vLLM takes anyway moves onto one when that loses less recomputation
    # per hit than this (policy/chunk_grid.py). "auto" (default): measured on the running
    # engine (bookkeeping/step_cost.py; one block until measured). An integer fixes it;
    # 0 makes chunk ends free.
    step_cost_tokens: int | str = "auto"
    # Seconds between INFO summary lines (none while idle); 0 turns them off.
    summary_interval: float = 60.0
    # Directory of the event log; default: <ssd_dir>/<identity>/events, none without SSD.
    event_log_dir: str | None = None
    # Size of one event-log file (bytes); two are kept (the current one and one rotated).
    event_log_bytes: int = 16 << 20
    # The fleet tier (docs/fleet.md): checkpoints shared by every engine of a fleet.
    # None (default): off. "mooncake": Mooncake Store at fleet_master, fleet_metadata_server
    # (`python -m histate_vllm.store.fleet.mooncake_service` prints both); "dir": a
    # directory every engine mounts (fleet_dir), holding at most fleet_bytes.
    fleet_backend: str | None = None
    fleet_master: str | None = None
    fleet_metadata_server: str | None = None
    # This host's address as the other Mooncake processes reach it (default: its name).
    fleet_local_hostname: str | None = None
    fleet_protocol: str = "tcp"
    fleet_device: str = ""
    fleet_dir: str | None = None
    fleet_bytes: int = 0
    # How long a request waits for the tier to say what it holds, and for a pull.
    fleet_lookup_timeout_s: float = 0.5
    fleet_pull_timeout_s: float = 30.0

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> HiStateConfig:
        extra = dict(extra or {})
        accepted = {f.name for f in fields(cls)}
        unknown = sorted(set(extra) - accepted)
        if unknown:
            raise ConfigError(
                f"HiStateConnector: unknown kv_connector_extra_config key(s) {unknown}; "
                f"accepted keys are {sorted(accepted)}"
            )
        if "dram_bytes" not in extra:
            raise ConfigError(
                "HiStateConnector: kv_connector_extra_config needs 'dram_bytes' "
                "(host memory for the cache, a positive integer of bytes)"
            )
        cfg = cls(
            dram_bytes=_positive_int(extra, "dram_bytes"),
            ssd_dir=_ssd_dir(extra),
            ssd_bytes=_nonneg_int(extra, "ssd_bytes") if "ssd_bytes" in extra else 0,
            policy=_choice(extra, "policy", POLICIES, "histate"),
            interval=_interval(extra),
            ssd_mirror=_flag(extra, "ssd_mirror", cls.ssd_mirror),
            ssd_queue_bytes=(
                _positive_int(extra, "ssd_queue_bytes")
                if "ssd_queue_bytes" in extra
                else cls.ssd_queue_bytes
            ),
            ssd_fsync=_flag(extra, "ssd_fsync", cls.ssd_fsync),
            ssd_read_timeout_s=_positive_seconds(extra, "ssd_read_timeout_s",
                                                 cls.ssd_read_timeout_s),
            step_cost_tokens=_step_cost(extra, cls.step_cost_tokens),
            summary_interval=_seconds(extra, "summary_interval", cls.summary_interval),
            event_log_dir=_dir(extra, "event_log_dir"),
            event_log_bytes=(
                _positive_int(extra, "event_log_bytes")
                if "event_log_bytes" in extra
                else cls.event_log_bytes
            ),
        )
        cfg = _fleet(cfg, extra)
        if cfg.ssd_dir is not None and cfg.ssd_bytes <= 0:
            raise ConfigError(
                "HiStateConnector: 'ssd_dir' is set, so 'ssd_bytes' must be a positive "
                "integer of bytes (the disk budget)"
            )
        if cfg.ssd_dir is not None and cfg.ssd_bytes < MIN_SSD_BYTES:
            raise ConfigError(
                f"HiStateConnector: 'ssd_bytes' must be at least {MIN_SSD_BYTES} bytes "
                f"(the store's own files and one entry), got {cfg.ssd_bytes}"
            )
        ram = physical_memory()
        if ram is not None and cfg.dram_bytes > ram:
            raise ConfigError(
                f"HiStateConnector: 'dram_bytes' must be from 1 to {ram} bytes (this "
                f"machine's memory, which vLLM and the system share), got {cfg.dram_bytes}"
            )
        if cfg.ssd_mirror and cfg.policy != "histate":
            raise ConfigError("HiStateConnector: 'ssd_mirror' applies to policy \"histate\" "
                              "only (\"lru\" always writes through)")
        if cfg.ssd_dir is None and cfg.ssd_bytes:
            raise ConfigError("HiStateConnector: 'ssd_bytes' is set but 'ssd_dir' is not")
        return cfg


FLEET_BACKENDS = ("mooncake", "dir")


def _fleet(cfg: HiStateConfig, extra: dict[str, Any]) -> HiStateConfig:
    """The fleet tier's keys: all or nothing of a backend's, and an SSD store to pull into."""
    keys = {k for k in extra if k.startswith("fleet_")}
    if "fleet_backend" not in extra:
        if keys:
            raise ConfigError(f"HiStateConnector: {sorted(keys)} set without 'fleet_backend' "
                              f"(one of {list(FLEET_BACKENDS)})")
        return cfg
    backend = _choice(extra, "fleet_backend", FLEET_BACKENDS, "")
    if cfg.ssd_dir is None:
        raise ConfigError("HiStateConnector: 'fleet_backend' needs 'ssd_dir': checkpoints "
                          "pulled from the fleet tier land in the engine's SSD store")
    need = (("fleet_master", "fleet_metadata_server") if backend == "mooncake"
            else ("fleet_dir", "fleet_bytes"))
    missing = [k for k in need if k not in extra]
    if missing:
        raise ConfigError(f"HiStateConnector: fleet_backend {backend!r} needs {missing}")
    other = {"mooncake": ("fleet_dir", "fleet_bytes"),
             "dir": ("fleet_master", "fleet_metadata_server", "fleet_local_hostname",
                     "fleet_protocol", "fleet_device")}[backend]
    stray = sorted(keys.intersection(other))
    if stray:
        raise ConfigError(f"HiStateConnector: {stray} do not apply to fleet_backend "
                          f"{backend!r}")
    strings = {}
    for key in ("fleet_master", "fleet_metadata_server", "fleet_local_hostname",
                "fleet_protocol", "fleet_device"):
        if key in extra:
            value = extra[key]
            if not isinstance(value, str) or (not value and key != "fleet_device"):
                raise ConfigError(f"HiStateConnector: '{key}' must be a string, got {value!r}")
            strings[key] = value
    if strings.get("fleet_protocol", "tcp") not in ("tcp", "rdma"):
        raise ConfigError("HiStateConnector: 'fleet_protocol' must be \"tcp\" or \"rdma\", "
                          f"got {strings['fleet_protocol']!r}")
    return replace(
        cfg, fleet_backend=backend, **strings,
        fleet_dir=_dir(extra, "fleet_dir"),
        fleet_bytes=_positive_int(extra, "fleet_bytes") if "fleet_bytes" in extra else 0,
        fleet_lookup_timeout_s=_positive_seconds(extra, "fleet_lookup_timeout_s",
                                                 cfg.fleet_lookup_timeout_s),
        fleet_pull_timeout_s=_positive_seconds(extra, "fleet_pull_timeout_s",
                                               cfg.fleet_pull_timeout_s),
    )


def _int(extra: dict[str, Any], key: str) -> int:
    value = extra[key]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"HiStateConnector: '{key}' must be an integer of bytes, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(
            f"HiStateConnector: '{key}' must be an integer of bytes, got {value!r}"
        ) from None


def _positive_int(extra: dict[str, Any], key: str) -> int:
    value = _int(extra, key)
    if value <= 0:
        raise ConfigError(f"HiStateConnector: '{key}' must be > 0, got {value}")
    return value


def _step_cost(extra: dict[str, Any], default: int | str) -> int | str:
    value = extra.get("step_cost_tokens", default)
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError("HiStateConnector: 'step_cost_tokens' must be \"auto\" or an "
                          f"integer >= 0 (tokens), got {value!r}")
    return value


def _nonneg_int(extra: dict[str, Any], key: str) -> int:
    value = _int(extra, key)
    if value < 0:
        raise ConfigError(f"HiStateConnector: '{key}' must be >= 0, got {value}")
    return value


def _positive_seconds(extra: dict[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    ok = not isinstance(value, bool) and isinstance(value, (int, float, str))
    try:  # "60" as well as 60, like `summary_interval`
        seconds = float(value) if ok else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ConfigError(
            f"HiStateConnector: '{key}' must be a positive number of seconds, got {value!r}"
        )
    return seconds


def _flag(extra: dict[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"HiStateConnector: '{key}' must be true or false, got {value!r}")
    return value


def _choice(extra: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = extra.get(key, default)
    if value not in choices:
        raise ConfigError(
            f"HiStateConnector: '{key}' must be one of {list(choices)}, got {value!r}"
        )
    return value


def _interval(extra: dict[str, Any]) -> str | int:
    value = extra.get("interval", "adaptive")
    if value == "adaptive":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        value = None
    else:
        try:
            value = int(value)
        except ValueError:
            value = None
    if value is None or value <= 0:
        raise ConfigError(
            "HiStateConnector: 'interval' must be \"adaptive\" or a positive number of "
            f"tokens, got {extra.get('interval')!r}"
        )
    return value


def _ssd_dir(extra: dict[str, Any]) -> str | None:
    return _dir(extra, "ssd_dir")


def _dir(extra: dict[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"HiStateConnector: '{key}' must be a directory path, got {value!r}")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"HiStateConnector: '{key}' {value!r} exists and is not a directory")
    return os.fspath(path)


def _seconds(extra: dict[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    ok = not isinstance(value, bool) and isinstance(value, (int, float, str))
    try:
        seconds = float(value) if ok else -1.0
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ConfigError(
            f"HiStateConnector: '{key}' must be a number of seconds >= 0, got {value!r}"
        )
    return seconds
