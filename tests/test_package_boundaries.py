"""Benchmarks and simulators live in baton.loadtest (bench/, sim/), not in the service packages:
a service package holds no module named like one, and imports none of them except the simulated
runner that `--engine sim` plugs into the engine in place of the model."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICE_PACKAGES = ("gateway", "router", "worker", "engine", "common")
BENCH_OR_SIM_NAME = re.compile(
    r"(^|_)(bench|benchmark|sim|simulator|replay|overload|loopback)(_|$)")
# The one simulator a service may import: the engine's stand-in for ModelRunner (`--engine sim`).
ALLOWED_IMPORTS = {"baton.loadtest.sim.runner"}


def _service_modules() -> list[Path]:
    return [p for pkg in SERVICE_PACKAGES for p in sorted((ROOT / "services" / pkg).rglob("*.py"))]


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_pattern_catches_the_modules_that_moved() -> None:
    moved = ("bench_throughput", "bench_decode", "sim_runner", "replay", "overload", "loopback")
    assert all(BENCH_OR_SIM_NAME.search(name) for name in moved)
    assert not BENCH_OR_SIM_NAME.search("scheduler") and not BENCH_OR_SIM_NAME.search("similarity")


def test_no_service_package_holds_a_benchmark_or_simulator_module() -> None:
    modules = _service_modules()
    assert len(modules) > 40, "the walk found the service packages"
    offenders = [str(p.relative_to(ROOT)) for p in modules if BENCH_OR_SIM_NAME.search(p.stem)]
    assert offenders == []


def test_services_import_no_benchmark_or_simulator_but_the_sim_runner() -> None:
    offenders = []
    for path in _service_modules():
        for name in _imported_modules(path):
            allowed = any(name == a or name.startswith(f"{a}.") for a in ALLOWED_IMPORTS)
            if name.startswith(("baton.loadtest.bench", "baton.loadtest.sim")) and not allowed:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []
