"""Start Mooncake Store for a fleet tier: its master (with the HTTP metadata server, no etcd)
and a long-lived `mooncake_client` whose memory holds the objects, every port bound to
`--host` (loopback unless told otherwise: Mooncake binds every interface by default).

    python -m histate_vllm.store.fleet.mooncake_service --segment 64GB
        # prints the connector's fleet settings, runs until interrupted

Engines then mount no memory of their own (`segment_bytes` 0), so an engine that dies
takes none of the fleet's objects with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field


def _binary(name: str) -> str:
    """A Mooncake program: beside this interpreter (a venv's bin) or on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = here if os.access(here, os.X_OK) else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: pip install 'histate-vllm[fleet]'")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_port(host: str, port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{proc.args[0]} did not listen on {host}:{port} in {timeout_s} s")


@dataclass
class MooncakeService:
    host: str = "127.0.0.1"
    segment: str = "256MB"  # the segment holder's memory: what the fleet tier can hold
    log_dir: str | None = None
    rpc_port: int = 0
    metadata_port: int = 0
    procs: list = field(default_factory=list)

    @property
    def master(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://{self.host}:{self.metadata_port}/metadata"

    def settings(self) -> dict:
        """The connector's fleet settings for engines on this host."""
        return {"fleet_backend": "mooncake", "fleet_master": self.master,
                "fleet_metadata_server": self.metadata_server}

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        out = subprocess.DEVNULL
        if self.log_dir is not None:
            out = open(os.path.join(self.log_dir, f"{name}.log"), "ab")  # noqa: SIM115
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start_master(self, timeout_s: float = 20.0) -> None:
        self.rpc_port = self.rpc_port or free_port(self.host)
        self.metadata_port = self.metadata_port or free_port(self.host)
        master = self._spawn([
            _binary("mooncake_master"), f"--rpc_address={self.host}",
            f"--rpc_port={self.rpc_port}", "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={self.host}",
            f"--http_metadata_server_port={self.metadata_port}",
            f"--metrics_host={self.host}", f"--metrics_port={free_port(self.host)}",
        ], "mooncake_master")
        _wait_port(self.host, self.rpc_port, master, timeout_s)
        _wait_port(self.host, self.metadata_port, master, timeout_s)

    def start_segment_holder(self, timeout_s: float = 20.0) -> None:
        port = free_port(self.host)
        holder = self._spawn([
            _binary("mooncake_client"), f"--host={self.host}", f"--port={port}",
            f"--global_segment_size={self.segment}", f"--master_server_address={self.master}",
            f"--metadata_server={self.metadata_server}", "--protocol=tcp",
        ], "mooncake_client")
        _wait_port(self.host, port, holder, timeout_s)

    def start(self) -> MooncakeService:
        self.start_master()
        self.start_segment_holder()
        return self

    @property
    def master_proc(self) -> subprocess.Popen:
        return next(p for p in self.procs if os.path.basename(p.args[0]) == "mooncake_master")

    def stop_master(self) -> None:
        """Kill the master alone (a fault: every key it knew is lost); `start_master`
        starts another on the same ports."""
        master = self.master_proc
        master.kill()
        master.wait()
        self.procs.remove(master)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1",
                    help="address every port binds to and engines reach (default loopback)")
    ap.add_argument("--segment", default="4GB", help="memory the fleet tier holds, e.g. 64GB")
    ap.add_argument("--rpc-port", type=int, default=50051)
    ap.add_argument("--metadata-port", type=int, default=8080)
    args = ap.parse_args(argv)
    service = MooncakeService(args.host, args.segment, rpc_port=args.rpc_port,
                              metadata_port=args.metadata_port).start()
    print(json.dumps(service.settings()), flush=True)
    try:
        while all(p.poll() is None for p in service.procs):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        service.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
