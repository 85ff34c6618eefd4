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


def swap_fleet_state(fleet_dir: Path, victim: str, donor: str) -> int:
    """In a fleet directory, replace the states of request `victim`'s deepest checkpoint by
    those of request `donor`'s (another prefix), re-encoded and re-checksummed under the
    victim's keys, so every check passes. Returns the victim's position."""
    from histate_vllm.store.fleet import objects
    from histate_vllm.store.format import Kind, decode_header, decode_manifest

    manifests = {}
    for path in fleet_dir.glob("histate/*/mf/*"):
        m = decode_manifest(path.read_bytes())
        manifests[path] = m
    # A manifest's provenance is the engine's request id: vLLM's, with its own suffix.
    def of(m, request_id):
        return m.provenance == request_id or m.provenance.startswith(request_id + "-")

    mine = [(p, m) for p, m in manifests.items() if of(m, victim)]
    theirs = {m.key[-4:]: (p, m) for p, m in sorted(
        ((p, m) for p, m in manifests.items() if of(m, donor)),
        key=lambda pm: pm[1].position)}
    assert mine and theirs, (victim, donor, {m.provenance for m in manifests.values()})
    deepest = max(m.position for _, m in mine)
    for path, m in mine:
        if m.position != deepest:
            continue
        dpath, dm = theirs[m.key[-4:]]  # same state group, another prefix
        data = (dpath.parents[1] / "st" / dm.state_file).read_bytes()
        payload = data[decode_header(data) and objects.HEADER_BYTES:]
        obj, csum, algo = objects.encode_payload(m.identity, Kind.STATE, m.key, payload,
                                                 "negative-control")
        state_file = objects.new_state_file(m.key)
        (path.parents[1] / "st" / state_file).write_bytes(obj)
        refs = list(zip(m.chunk_keys, m.chunk_nbytes, m.chunk_checksums, m.chunk_algos))
        path.write_bytes(objects.encode_checkpoint_manifest(
            m.identity, m.key, m.position, "negative-control", state_file,
            len(payload), csum, algo, refs))
    return deepest
