"""Small files and small functions: no Python file over 500 lines and no function over 60, outside
the generated gRPC stubs, so that each module stays one concept a reader can hold."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("services", "loadtest", "operators", "kernels", "proto", "tests")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 60


def _sources() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
            if not p.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))]


def long_functions(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(root)}:{node.name}")
    return found


def test_the_walk_finds_the_sources() -> None:
    assert len(_sources()) > 300


def test_no_file_is_over_500_lines() -> None:
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in _sources()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert long == []


def test_no_function_is_over_60_lines() -> None:
    assert [f for p in _sources() for f in long_functions(p)] == []


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    source = tmp_path / "long.py"
    # f spans 61 lines, g 2
    source.write_text("def f():\n" + "    x = 1\n" * 60 + "\n\ndef g():\n    pass\n")
    assert long_functions(source, tmp_path) == ["long.py:f"]
