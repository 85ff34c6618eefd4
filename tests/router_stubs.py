"""Stub OpenAI workers for tests of vllm-router itself: no engine behind them."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Stub(BaseHTTPRequestHandler):
    name = "a"  # the completion text: which worker answered

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        self._reply({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._reply({"id": "x", "object": "text_completion", "model": "tiny",
                     "choices": [{"index": 0, "text": self.name, "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def log_message(self, *args):
        pass


def stub_worker(name: str = "a") -> tuple[str, ThreadingHTTPServer]:
    """A worker answering /v1/models, /health and /v1/completions (text: `name`) on a
    loopback port; returns its URL and server (`stop_worker` ends it)."""
    handler = type(f"Stub_{name}", (_Stub,), {"name": name})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def stop_worker(server: ThreadingHTTPServer) -> None:
    """Stop serving and close the port: the next connection is refused, as to a dead engine."""
    server.shutdown()
    server.server_close()
