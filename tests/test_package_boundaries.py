"""The gateway and the shared package stay light: neither imports the engine or the worker, nor torch itself, so
the gateway runs without them and `common` is a leaf every service can use. (transformers, which the gateway
tokenizes with, loads torch on its own when installed; that is not counted.)"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import baton.services

SERVICES = Path(baton.services.__file__).parent
FORBIDDEN = ("baton.services.engine", "baton.services.worker", "torch")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (function-local imports included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
    return found


def _forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


@pytest.mark.parametrize("package", ["gateway", "common"])
def test_package_imports_neither_engine_nor_worker(package: str) -> None:
    leaks = [f"{path.relative_to(SERVICES)}:{line} imports {module}"
             for path in sorted((SERVICES / package).rglob("*.py"))
             for line, module in imported_modules(path) if _forbidden(module)]
    assert leaks == []


def test_the_check_sees_a_leak(tmp_path: Path) -> None:
    leaky = tmp_path / "leaky.py"
    leaky.write_text("def f():\n    from baton.services.engine.llm_engine import LLMEngine\n")
    assert [m for _, m in imported_modules(leaky) if _forbidden(m)] == ["baton.services.engine.llm_engine"]


def test_importing_the_gateway_loads_no_engine_or_worker() -> None:
    """The static check misses imports made by name; a fresh interpreter shows what actually loads."""
    modules = [f"baton.services.gateway.{p.stem}" for p in (SERVICES / "gateway").glob("*.py")]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print([m for m in sys.modules if m.startswith({FORBIDDEN[:2]!r})])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
