"""Regenerates the Python gRPC stubs next to the .proto files: `python proto/generate.py`.

The stubs are committed (so installing Baton needs no protoc) and importable as `baton.v1.*`,
mirroring the proto package; tests/proto/test_stubs_fresh.py fails when they no longer match the
.proto sources.
"""
from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent


def sources() -> list[Path]:
    return sorted(PROTO_ROOT.glob("baton/v1/*.proto"))


def generate(out_dir: Path) -> None:
    # google/protobuf/*.proto, shipped with grpcio-tools
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out_dir}",
        f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(PROTO_ROOT)) for p in sources())
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed; see its message above")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT)
