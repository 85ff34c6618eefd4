"""Negative controls' tampering with a store: wrong bytes that still verify, so only the
exactness comparison can catch them."""

from __future__ import annotations

from pathlib import Path

import msgspec


def swap_state(store_root: Path, wanted_position: int) -> None:
    """Replace the states of the checkpoint at `wanted_position` by another prefix's."""
    from histate_vllm.store import SSDStore, StoreIdentity

    (ident_file,) = store_root.glob("*/identity.json")
    identity = msgspec.json.decode(ident_file.read_bytes(), type=StoreIdentity)
    store = SSDStore(store_root, identity, budget_bytes=1 << 40)
    index = store.scan()
    victims = {k: c for k, c in index.checkpoints.items() if c.position == wanted_position}
    donors = {k[-4:]: k for k, c in index.checkpoints.items() if c.position != wanted_position}
    assert victims and donors
    for key, info in victims.items():
        donor = donors[key[-4:]]  # same state group, another prefix
        payload = bytearray(index.checkpoints[donor].state_nbytes)
        store.read_checkpoint(donor, memoryview(payload))
        store.publish_checkpoint(key, payload, position=info.position,
                                 chunk_keys=info.chunk_keys, provenance="negative-control")
