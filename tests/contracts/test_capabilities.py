"""Each capability the seam detects, pinned to the vLLM versions that must have it.

The table below is written out here, not read from the product: a detection that goes wrong
on one version (a renamed attribute, a moved class) fails here on that version's contract run,
instead of silently switching a code path, or a contract test, off. The contract tests branch
on this table too (`expect`), never on the product's detection.
"""

from __future__ import annotations

import pytest

from histate_vllm.vllm_glue.seam import capabilities

# capability -> (0.32, 0.33, 0.34)
TABLE = {
    "DEVICE_POINTERS": (False, False, True),
    "FAILED_JOBS": (False, False, True),
    "STATS_INFO": (False, True, True),
    "OFFLOAD_JUNCTION": (False, False, True),
    "LOOKAHEAD_HASHES": (False, False, True),
    "OMP_RESERVATION": (True, True, True),
}
VERSIONS = ((0, 32), (0, 33), (0, 34))


def expect(name: str) -> bool:
    """What the installed vLLM must offer, by its version (for tests to branch on)."""
    minor = capabilities.minor_version(capabilities.VLLM_VERSION)
    return TABLE[name][VERSIONS.index(minor)]


def test_the_installed_vllm_is_one_the_table_covers():
    assert capabilities.minor_version(capabilities.VLLM_VERSION) in VERSIONS, (
        f"vLLM {capabilities.VLLM_VERSION}: add its column to TABLE")
    assert capabilities.SUPPORTED == (VERSIONS[0], VERSIONS[-1])


def test_each_capability_is_detected_as_its_version_has_it():
    want = {name: expect(name) for name in TABLE}
    assert capabilities.detected() == want, f"vLLM {capabilities.VLLM_VERSION}"


@pytest.mark.parametrize("version", ["0.32.0", "0.33.1", "0.34.0"])
def test_the_seam_expects_what_the_table_says(version):
    minor = capabilities.minor_version(version)
    assert capabilities.expected(version) == {
        name: row[VERSIONS.index(minor)] for name, row in TABLE.items()}
    assert capabilities.expected("0.31.0") is None and capabilities.expected("0.35.0") is None
