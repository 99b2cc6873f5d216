"""Package boundaries, checked on the source:
- the gateway, the router, the OpenAI protocol and the shared package stay light: none imports the
  engine or the worker, nor torch itself, so the gateway and router run without them and `common`
  is a leaf every service can use (transformers, which the gateway tokenizes with, loads torch on
  its own when installed; that is not counted);
- the OpenAI protocol (`services/openai`) is the gateway's and `baton run-batch`'s alike, so it
  imports no service either: neither the gateway nor the router;
- benchmarks and simulators live in baton.loadtest (bench/, sim/, and their commands in
  commands/), not in the services: no module under services/ is named like one or imports from
  baton.loadtest, except the command-layer module that hands the engine the simulated runner
  `--engine sim` plugs in (services/cli/engine_runner.py)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import baton.services

SERVICES = Path(baton.services.__file__).parent
FORBIDDEN = ("baton.services.engine", "baton.services.worker", "torch")
SERVICE_PACKAGES = ("gateway", "router", "worker", "engine", "common", "openai")
LIGHT_PACKAGES = ["gateway", "router", "common", "openai"]
# What the protocol and the shared package must not import, besides FORBIDDEN.
SERVICES_ABOVE = ("baton.services.gateway", "baton.services.router")
BENCH_OR_SIM_NAME = re.compile(
    r"(^|_)(bench|benchmark|sim|simulator|replay|overload|loopback)(_|$)")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (function-local imports included); for `from m
    import n`, both m and m.n, since n may be a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _forbidden(module: str, forbidden: tuple[str, ...] = FORBIDDEN) -> bool:
    return any(module == f or module.startswith(f + ".") for f in forbidden)


def _service_modules() -> list[Path]:
    return [p for pkg in SERVICE_PACKAGES for p in sorted((SERVICES / pkg).rglob("*.py"))]


def _leaks(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted({f"{path.relative_to(SERVICES)}:{line} imports {module}"
                   for path in sorted((SERVICES / package).rglob("*.py"))
                   for line, module in imported_modules(path) if _forbidden(module, forbidden)})


@pytest.mark.parametrize("package", LIGHT_PACKAGES)
def test_package_imports_neither_engine_nor_worker(package: str) -> None:
    assert _leaks(package, FORBIDDEN) == []


def test_the_check_sees_a_leak(tmp_path: Path) -> None:
    leaky = tmp_path / "leaky.py"
    leaky.write_text("def f():\n    from baton.services.engine.llm_engine import LLMEngine\n")
    assert {m for _, m in imported_modules(leaky) if _forbidden(m)} == {
        "baton.services.engine.llm_engine", "baton.services.engine.llm_engine.LLMEngine"}
    leaky.write_text("from baton.services.gateway import state\n")
    assert {m for _, m in imported_modules(leaky) if _forbidden(m, SERVICES_ABOVE)} == {
        "baton.services.gateway", "baton.services.gateway.state"}


@pytest.mark.parametrize("package", ["openai", "common"])
def test_protocol_and_shared_package_import_no_service_above_them(package: str) -> None:
    assert _leaks(package, SERVICES_ABOVE) == []


@pytest.mark.parametrize("package", LIGHT_PACKAGES)
def test_importing_the_package_loads_no_engine_or_worker(package: str) -> None:
    """The static check misses imports made by name; a fresh interpreter shows what actually
    loads."""
    modules = [".".join(("baton.services", *p.relative_to(SERVICES).with_suffix("").parts))
               for p in (SERVICES / package).rglob("*.py") if p.stem != "__init__"]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print([m for m in sys.modules if m.startswith({FORBIDDEN[:2]!r})])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_the_pattern_catches_the_modules_that_moved() -> None:
    moved = ("bench_throughput", "bench_decode", "sim_runner", "replay", "overload", "loopback")
    assert all(BENCH_OR_SIM_NAME.search(name) for name in moved)
    assert not BENCH_OR_SIM_NAME.search("scheduler") and not BENCH_OR_SIM_NAME.search("similarity")


def test_no_service_package_holds_a_benchmark_or_simulator_module() -> None:
    """The command layer included: `baton bench` and `baton loadtest` live in baton.loadtest."""
    modules = sorted(SERVICES.rglob("*.py"))
    assert len(modules) > 40, "the walk found the service packages"
    offenders = [str(p.relative_to(SERVICES)) for p in modules if BENCH_OR_SIM_NAME.search(p.stem)]
    assert offenders == []


def test_services_import_nothing_from_loadtest() -> None:
    """The engine included: `--engine sim`'s runner comes from its caller, the one command module
    allowed to name it (the `baton` entry point finds the bench commands by module name)."""
    allowed = {Path("cli/engine_runner.py")}
    modules = [p for p in sorted(SERVICES.rglob("*.py")) if p.relative_to(SERVICES) not in allowed]
    offenders = [f"{path.relative_to(SERVICES)}:{line} imports {name}"
                 for path in modules for line, name in imported_modules(path)
                 if name == "baton.loadtest" or name.startswith("baton.loadtest.")]
    assert offenders == []
