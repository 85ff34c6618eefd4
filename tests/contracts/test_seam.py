"""HiState meets vLLM's insides in one place: every contact is in the seam and in its table.

`scripts/vllm_contacts.py` finds, on the vLLM this interpreter has, every private read,
override and patch of vLLM's, and every branch on what vLLM offers, in histate_vllm's
source. Run in every contract env, so each version's own private names are checked.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
import sys

from tests.contracts.conftest import REPO

# At most half of what there was before the seam on the fewest (39 on vLLM 0.32).
MAX_CONTACTS = 19


@functools.cache
def _contacts():
    spec = importlib.util.spec_from_file_location("vllm_contacts",
                                                  REPO / "scripts" / "vllm_contacts.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod, tuple(mod.scan(REPO))  # one scan for the module: it imports vLLM's classes


def test_every_contact_is_in_the_seam():
    _, contacts = _contacts()
    outside = [c for c in contacts if not c.in_seam]
    assert not outside, "\n".join(f"{c.path}:{c.line} {c.kind} {c.what}" for c in outside)


def test_contacts_are_few_and_each_is_in_the_table():
    mod, contacts = _contacts()
    touches = [c for c in contacts if c.kind != mod.VERSION_BRANCH]
    assert len(touches) <= MAX_CONTACTS, [c.what for c in touches]
    table = (REPO / "docs" / "vllm-seam.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    listed = {m for line in rows for m in re.findall(r"`([A-Za-z_.]+)`", line.split("|")[1])}
    missing = sorted({c.function for c in touches} - listed)
    assert not missing, f"contacts not in docs/vllm-seam.md's table: {missing}"


def test_the_counter_finds_a_contact_outside_the_seam(tmp_path):
    """Negative control: a private read planted in the connector is found, outside."""
    mod, _ = _contacts()
    pkg = tmp_path / "histate_vllm"
    subprocess.run(["cp", "-r", str(REPO / "histate_vllm"), str(pkg)], check=True)
    connector = pkg / "connector.py"
    connector.write_text(connector.read_text().replace(
        "        self._layout = spec.layout\n",
        "        self._layout = spec.layout\n        self._req_status.clear()\n", 1))
    planted = [c for c in mod.scan(tmp_path) if not c.in_seam]
    assert [(c.kind, c.what) for c in planted] == [("private", "reads self._req_status")]


def test_histate_installs_no_import_hook():
    probe = ("import sys\nbefore = list(sys.meta_path)\nimport histate_vllm, "
             "histate_vllm.kernels\nprint(len(sys.meta_path) - len(before))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "0"
