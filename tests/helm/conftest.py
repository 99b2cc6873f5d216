"""Renders the chart once per values file with the real helm binary (`make .tools/helm` fetches
it)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "baton"
# Name -> values file (None: the chart's defaults). Each name has a golden file under golden/.
VALUES = {
    "default": None,
    **{p.stem.removesuffix("-values"): p
       for p in sorted((CHART / "ci").glob("*-values.yaml"))}
}
RELEASE, NAMESPACE = "baton", "baton-system"


def find_helm() -> str | None:
    for candidate in (os.environ.get("BATON_HELM"), str(REPO / ".tools" / "helm"),
                      shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def helm() -> str:
    found = find_helm()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(
                "no helm binary: `make test` fetches it into .tools/helm (or set BATON_HELM)")
        pytest.skip("no helm binary: run `make .tools/helm` or set BATON_HELM")
    return found


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    # HELM_* homes point into a temp dir so that no user config or plugin changes what renders.
    env = {
        **os.environ, "HELM_CONFIG_HOME": "/tmp/baton-helm/config",
        "HELM_CACHE_HOME": "/tmp/baton-helm/cache", "HELM_DATA_HOME": "/tmp/baton-helm/data"
    }
    return subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def template_args(values: Path | None) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    return args + (["-f", str(values)] if values else [])


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str, str]:
    """Values name -> `helm template` output."""
    out = {}
    for name, values in VALUES.items():
        result = run_helm(helm, *template_args(values))
        assert result.returncode == 0, f"helm template ({name}) failed:\n{result.stderr}"
        out[name] = result.stdout
    return out


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]
