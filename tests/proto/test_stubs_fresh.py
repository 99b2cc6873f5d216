"""The committed gRPC stubs must be what `python proto/generate.py` makes from the .proto files today."""
from __future__ import annotations

import importlib.util
from pathlib import Path

PROTO = Path(__file__).resolve().parents[2] / "proto"


def test_generated_stubs_match_the_proto_sources(tmp_path):
    spec = importlib.util.spec_from_file_location("proto_generate", PROTO / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    generate.generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    committed = sorted(p.relative_to(PROTO) for p in (PROTO / "baton" / "v1").glob("*_pb2*.py*"))
    assert fresh == committed, "stubs missing or extra: run `python proto/generate.py`"
    stale = [str(p) for p in fresh if (tmp_path / p).read_bytes() != (PROTO / p).read_bytes()]
    assert not stale, f"stale stubs {stale}: run `python proto/generate.py` and commit the result"
