from _helpers import Clock, FakeManager, chain, kv_item, st_item

from histate_vllm.policy import Tier, decode_events, encode_events, make_policy
from histate_vllm.policy.explain import explain_log, main

BT = 256


def setup():
    clock = Clock()
    core = make_policy("histate", budgets={Tier.DRAM: 9_000, Tier.SSD: 0}, block_tokens=BT,
                       interval=1024, clock=clock, kv_bytes_per_token=1.0)
    return core, FakeManager(core), clock


def scenario(tmp_path):
    core, mgr, clock = setup()
    h = chain(range(8))
    plan = core.plan_captures("r1", h, 8 * BT + 1, 0)
    assert plan == [1024, 2048]
    items = [kv_item(h, i, BT, 500, "r1") for i in range(8)]
    items += [st_item(h, 3, BT, 2000, req="r1"), st_item(h, 7, BT, 2000, req="r1", terminal=True)]
    items.append(st_item(h, 5, BT, 2000, req="r1"))  # not planned, and no free room for it
    mgr.admit(items, Tier.DRAM)
    mgr.commit(Tier.DRAM)
    core.request_finished("r1")
    clock.advance(10)
    other = chain(range(8), salt=b"o")
    mgr.admit([kv_item(other, i, BT, 500) for i in range(8)] + [st_item(other, 7, BT, 2000)],
              Tier.DRAM)  # needs room: evicts
    events = core.drain_events()
    ops = {e.op for e in events}
    assert {"plan", "admit", "reject", "evict"} <= ops
    assert all(e.reason for e in events if e.op in ("reject", "evict"))
    data = encode_events(events)
    assert decode_events(data) == events

    text = core.explain(h, 1536)
    assert "not in the capture plan" in text
    offline = explain_log(events, h, 1536, BT)
    assert "not in the capture plan" in offline

    ev_file = tmp_path / "events.msgpack"
    ev_file.write_bytes(data)
    hashes = tmp_path / "prompt.hex"
    hashes.write_text("\n".join(x.hex() for x in h))
    return ev_file, hashes


def test_every_decision_is_a_serialisable_event_with_a_reason(tmp_path):
    scenario(tmp_path)


def test_explain_cli(tmp_path, capsys):
    ev_file, hashes = scenario(tmp_path)
    main(["--events", str(ev_file), "--hashes", str(hashes), "--block-tokens", str(BT),
          "--position", "2048"])
    out = capsys.readouterr().out
    assert "position 2048" in out and "history of this node" in out


def test_explain_edge_positions():
    core, mgr, clock = setup()
    h = chain(range(4))
    assert "not a block boundary" in core.explain(h, 100)
    assert "beyond this prompt" in core.explain(h, 10 * BT)
    assert "no admission" in core.explain(h, 2 * BT)
