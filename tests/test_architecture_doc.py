"""docs/architecture.md names files and functions so a newcomer can find each step; every one
must exist, so that a rename or a move fails here rather than leaving the page quietly wrong."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
TOP_DIRS = ("services/", "loadtest/", "proto/", "operators/", "kernels/", "tests/", "docs/",
            "deploy/")
# `path` or `path:Name` or `path:Class.method`, in backticks
SPAN = re.compile(r"`([^`\s]+)`")


def _spans() -> list[str]:
    return [s for s in SPAN.findall(DOC.read_text()) if s.startswith(TOP_DIRS)]


def _paths() -> list[str]:
    return sorted({s.split(":", 1)[0] for s in _spans()})


def _references() -> list[tuple[str, str]]:
    return sorted({tuple(s.split(":", 1)) for s in _spans() if ":" in s})  # type: ignore[misc]


@cache
def _names(path: str) -> dict[str, set[str]]:
    """Top-level names of a module (defs, classes, assignments), each class's to its members."""
    tree = ast.parse((ROOT / path).read_text())
    names: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            names[node.name] = {n.name for n in node.body if isinstance(n, members)}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update({t.id: set() for t in targets if isinstance(t, ast.Name)})
    return names


def test_the_page_names_code():
    # The pattern has not silently stopped matching.
    assert len(_paths()) > 30 and len(_references()) > 50


@pytest.mark.parametrize("path", _paths())
def test_path_exists(path: str):
    # A pattern such as loadtest/commands/bench_*.py must match at least one file.
    found = any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
    assert found, f"docs/architecture.md names {path}, which does not exist"


@pytest.mark.parametrize("path,name", _references())
def test_reference_names_a_definition(path: str, name: str):
    assert path.endswith(".py"), f"{path}:{name}: only Python files have named definitions"
    names = _names(path)
    top, _, member = name.partition(".")
    assert top in names, f"{path} defines no {top!r}"
    if member:
        assert member in names[top], f"{path}: class {top} has no member {member!r}"


def test_lines_fit():
    long = [i for i, line in enumerate(DOC.read_text().splitlines(), 1) if len(line) > 100]
    assert not long, f"lines over 100 columns: {long}"
