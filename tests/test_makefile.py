"""`make run` installs what serving needs, not the test extras (lm-eval, LangChain, schemathesis,
Triton: 1.8 GB of a fresh .venv's 3.5 GB); `make test` still installs them."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def recipe(target: str) -> list[str]:
    """The commands `make TARGET` runs from scratch (-B: as if nothing were built yet)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    result = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=True)
    return result.stdout.splitlines()


def test_run_installs_baton_without_the_test_extras() -> None:
    installs = [line for line in recipe("run") if "pip install" in line]
    assert any(line.endswith("pip install -q -e .") for line in installs), installs
    assert not any("[test]" in line for line in installs), installs


def test_test_installs_the_test_extras() -> None:
    assert any('pip install -q -e ".[test]"' in line for line in recipe("test"))
