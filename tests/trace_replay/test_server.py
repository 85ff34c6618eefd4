"""trace_replay.server.serving: start a process, wait until it answers, stop it."""

from __future__ import annotations

import sys
import urllib.request

import pytest

from trace_replay.server import free_port, serving

# Answers /v1/models with 200 once it is listening.
MODELS = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(b'{"data": []}')
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_serving_waits_for_the_answer_and_stops_the_process(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-c", MODELS, str(port)]
    with serving(cmd, tmp_path / "log", f"http://127.0.0.1:{port}", what="dummy",
                 startup_timeout=30, poll_s=0.1) as url:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
            assert r.status == 200
    with pytest.raises(OSError):  # stopped: nothing listens any more
        urllib.request.urlopen(f"{url}/v1/models", timeout=2)


def test_a_process_that_exits_raises_with_its_log(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"(?s)dummy exited with 3.*bad flag"):
        with serving(cmd, tmp_path / "log", f"http://127.0.0.1:{free_port()}", what="dummy",
                     startup_timeout=30, poll_s=0.1):
            pass
