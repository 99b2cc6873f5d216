"""KVLayout and its wire message carry the same fields, and a KV handle's layout survives the
trip."""
from dataclasses import fields

from baton.services.worker.kv_transfer.base import KVLayout, layout_from_proto, layout_to_proto
from baton.v1 import worker_pb2 as pb


def test_dataclass_and_message_declare_the_same_fields() -> None:
    assert {f.name for f in fields(KVLayout)} == set(pb.KVLayout.DESCRIPTOR.fields_by_name)


def test_round_trip_is_identity() -> None:
    layout = KVLayout(num_layers=3, num_blocks=1000, block_size=16, block_nbytes=1 << 17,
                      base_address=(1 << 40) + 4096, dtype="bfloat16")
    assert layout_from_proto(layout_to_proto(layout)) == layout
