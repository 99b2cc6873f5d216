"""The committed gRPC stubs must be what `python proto/generate.py` makes from the .proto files
today."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROTO = Path(__file__).resolve().parents[2] / "proto"


def test_generated_stubs_match_the_proto_sources(tmp_path):
    # In a child process: grpc_tools loads its own C++ protobuf, which must never share a process
    # with NIXL's (importing nixl after it aborts the interpreter).
    subprocess.run([sys.executable, str(PROTO / "generate.py"), str(tmp_path)], check=True)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    committed = sorted(p.relative_to(PROTO) for p in (PROTO / "baton" / "v1").glob("*_pb2*.py*"))
    assert fresh == committed, "stubs missing or extra: run `python proto/generate.py`"
    stale = [str(p) for p in fresh if (tmp_path / p).read_bytes() != (PROTO / p).read_bytes()]
    assert not stale, f"stale stubs {stale}: run `python proto/generate.py` and commit the result"
