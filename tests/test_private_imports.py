"""Tests use public names: no test imports an underscored name from baton or from another test
module, and no module of baton imports one from another. And one launcher: only tests/launcher.py
starts service processes; the other tests ask it."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# The CUDA IPC transport's socket handler and listener are tested directly on a GPU, below the
# KVTransport interface, because a restarted peer is only observable there.
ALLOWED = {("baton.services.worker.kv_transfer.cuda_ipc", name)
           for name in ("_closed_by_peer", "_Handler", "_Listener")}
LAUNCHERS = {("baton.services.common.process", "launch_service"),
             ("baton.services.common.process", "start_service"),
             ("baton.services.cli.serve", "start_stack")}


def _imports_from(root: Path) -> list[tuple[Path, ast.ImportFrom]]:
    return [(path, node) for path in sorted(root.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            if isinstance(node, ast.ImportFrom) and node.module]


def private_imports(root: Path) -> list[str]:
    found = []
    for path, node in _imports_from(root):
        if node.level == 0 and not node.module.startswith(("baton", "tests")):
            continue
        for alias in node.names:
            if alias.name.startswith("_") and (node.module, alias.name) not in ALLOWED:
                found.append(f"{path.relative_to(root)}: {node.module}.{alias.name}")
    return found


def test_no_test_imports_a_private_name() -> None:
    assert private_imports(TESTS) == []


def test_no_baton_module_imports_a_private_name() -> None:
    for package in ("services", "loadtest"):
        assert private_imports(TESTS.parent / package) == []


def test_only_the_launcher_starts_services() -> None:
    starters = sorted({str(path.relative_to(TESTS)) for path, node in _imports_from(TESTS)
                       for alias in node.names if (node.module, alias.name) in LAUNCHERS})
    assert starters == ["launcher.py"]


def test_the_check_finds_one(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text("from baton.services.cli.serve import _roles\n"
                                        "from .helpers import _clock\nfrom os import _exit\n")
    assert private_imports(tmp_path) == ["test_x.py: baton.services.cli.serve._roles",
                                         "test_x.py: helpers._clock"]
