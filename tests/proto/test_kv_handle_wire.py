"""KVHandle and KVLayout carry the same fields as their wire messages, and a KV handle survives the
trip field for field."""
from dataclasses import fields, replace

from baton.services.engine.kv.layout import KVLayout
from baton.services.worker.kv_transfer.base import (KVHandle, KVRankPeer, kv_handle_from_proto,
                                                    kv_handle_to_proto, layout_from_proto,
                                                    layout_to_proto)
from baton.v1 import worker_pb2 as pb

LAYOUT = KVLayout(num_layers=3, num_blocks=1000, block_size=16, block_nbytes=1 << 17,
                  base_address=(1 << 40) + 4096, dtype="bfloat16", order="HND")


def _names(message: type) -> set[str]:
    return set(message.DESCRIPTOR.fields_by_name)


def test_dataclasses_and_messages_declare_the_same_fields() -> None:
    assert {f.name for f in fields(KVLayout)} == _names(pb.KVLayout)
    assert {f.name for f in fields(KVHandle)} == _names(pb.KVHandle)
    assert {f.name for f in fields(KVRankPeer)} == _names(pb.KVRankPeer)


def test_layout_round_trip_is_identity() -> None:
    assert layout_from_proto(layout_to_proto(LAYOUT)) == LAYOUT


def test_layout_without_an_order_is_token_major() -> None:
    """A worker from before the order field sends none: its cache is NHD."""
    message = layout_to_proto(LAYOUT)
    message.ClearField("order")
    assert layout_from_proto(message).order == "NHD"


def _fully_populated() -> KVHandle:
    """Every field set and non-zero, so a field the mapping drops shows up."""
    return KVHandle(request_id="req-1", worker_id="prefill-0", worker_address="10.0.0.7:50051",
                    transport="nixl", agent_name="agent-0", agent_host="10.0.0.7", agent_port=5600,
                    layout=LAYOUT, block_ids=(4, 9, 2), num_tokens=40,
                    expires_at_unix_ms=1_800_000_000_000, block_hashes=((1 << 63) + 5, 17),
                    rank_peers=(KVRankPeer("agent-0", "10.0.0.7", 5600, LAYOUT, 0, 4),
                                KVRankPeer("agent-0-rank1", "10.0.0.7", 5601, LAYOUT, 4, 4)),
                    head_layout=LAYOUT, head_row=b"\x00\x00\x80?")


def test_every_handle_field_is_set_on_the_wire() -> None:
    message = kv_handle_to_proto(_fully_populated())
    assert [name for name in _names(pb.KVHandle) if not getattr(message, name)] == []


def test_handle_round_trip_is_identity() -> None:
    assert kv_handle_from_proto(kv_handle_to_proto(_fully_populated())) == _fully_populated()


def test_handle_without_a_head_round_trips_to_none() -> None:
    plain = replace(_fully_populated(), head_layout=None, head_row=b"")
    assert not kv_handle_to_proto(plain).HasField("head_layout")
    assert kv_handle_from_proto(kv_handle_to_proto(plain)) == plain
