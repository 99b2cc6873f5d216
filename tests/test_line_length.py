"""Every line of the project's Python is within 100 columns (generated protobuf stubs aside), so
the code reads side by side in a review and in a terminal split."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 100
PACKAGES = ("services", "proto", "kernels", "operators", "tests", "loadtest", "deploy", "docs")


def long_lines() -> list[str]:
    found = []
    paths = [ROOT / "setup.py"]
    paths += [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    for path in paths:
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if len(line) > LIMIT:
                found.append(f"{path.relative_to(ROOT)}:{number} ({len(line)} columns)")
    return found


def test_lines_within_100_columns() -> None:
    assert long_lines() == []
