"""The chart lints, renders with every values file, and what it renders is valid Kubernetes and
Baton."""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from baton.operators import crd_schema
from baton.operators.schema_checks import apply_defaults, rule_violations
from tests.helm.conftest import CHART, VALUES, documents, run_helm

GOLDEN = Path(__file__).parent / "golden"
KUBERNETES_VERSION = "1.35"
# Prometheus Operator kinds: no schema ships offline, so their shape is checked by hand below.
MONITOR_KINDS = {"ServiceMonitor", "PodMonitor"}


@pytest.mark.parametrize("name", VALUES)
def test_helm_lint(helm: str, name: str) -> None:
    values = VALUES[name]
    result = run_helm(helm, "lint", "--strict", str(CHART),
                      *(["-f", str(values)] if values else []))
    assert result.returncode == 0, result.stdout + result.stderr


def test_values_schema_refuses_unknown_keys(helm: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("operator:\n  autoscaleIntervalSecond: 5\n")
    result = run_helm(helm, "template", "x", str(CHART), "-f", str(bad))
    assert result.returncode != 0 and "autoscaleIntervalSecond" in result.stderr


@pytest.mark.parametrize(
    "gateway", ["replicas: 2", "replicas: 2\n      stateStoreSecretRef: {name: pg}"])
def test_gateway_replicas_without_a_shared_rate_limit_store_are_refused(
        helm: str, tmp_path: Path, gateway: str) -> None:
    values = tmp_path / "replicas.yaml"
    values.write_text("example:\n  enabled: true\n  spec:\n    gateway:\n      " + gateway + "\n")
    result = run_helm(helm, "template", "x", str(CHART), "-f", str(values))
    assert result.returncode != 0
    assert "needs a shared rate-limit store" in result.stderr, result.stderr


@pytest.mark.parametrize(("gateway", "message"), [
    ("replicas: 2\n      rateLimitStoreSecretRef: {name: redis}", "needs a shared state store"),
    ("stateStoreSecretRef: {name: pg}\n      stateStoreVolume: {claimName: state}",
     "are two state stores")])
def test_gateway_state_stores_that_cannot_serve_are_refused(
        helm: str, tmp_path: Path, gateway: str, message: str) -> None:
    """Replicas each on a store of their own, or two stores at once."""
    values = tmp_path / "stores.yaml"
    values.write_text("example:\n  enabled: true\n  spec:\n    gateway:\n      " + gateway + "\n")
    result = run_helm(helm, "template", "x", str(CHART), "-f", str(values))
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_gateway_replicas_with_shared_stores_render(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "replicas.yaml"
    values.write_text("example:\n  enabled: true\n  spec:\n    gateway:\n      replicas: 2\n"
                      "      rateLimitStoreSecretRef: {name: redis}\n"
                      "      stateStoreSecretRef: {name: pg}\n")
    result = run_helm(helm, "template", "x", str(CHART), "-f", str(values))
    assert result.returncode == 0, result.stderr
    example = next(d for d in documents(result.stdout) if d["kind"] == "BatonDeployment")
    assert example["spec"]["gateway"]["replicas"] == 2


def test_crd_files_are_the_generated_ones() -> None:
    for file_name, document in crd_schema.all_crds().items():
        on_disk = (CHART / "crds" / file_name).read_text(encoding="utf-8")
        assert on_disk == crd_schema.render(document), (
            f"crds/{file_name} is stale: run `python -m baton.operators.crd_schema "
            f"{CHART / 'crds'}`"
        )


@pytest.mark.parametrize("name", VALUES)
def test_manifests_validate(rendered: dict[str, str], name: str) -> None:
    docs = documents(rendered[name])
    assert {"CustomResourceDefinition", "Deployment", "Service"} <= {d["kind"] for d in docs}
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in MONITOR_KINDS:
            check_monitor(doc)
        elif doc["apiVersion"].startswith("serving.baton.dev/"):
            schema = crd_schema.open_api_schema(doc["kind"])
            jsonschema.Draft202012Validator(schema).validate(doc)
            assert rule_violations(schema, apply_defaults(schema, doc)) == [], where
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "baton", where


def check_monitor(doc: dict) -> None:
    spec = doc["spec"]
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert spec["selector"]["matchLabels"]
    endpoints = (spec["endpoints"]
                 if doc["kind"] == "ServiceMonitor" else spec["podMetricsEndpoints"])
    assert endpoints and all(e["port"] and e["interval"] for e in endpoints)


def pod_specs(docs: list[dict]) -> list[dict]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]


@pytest.mark.parametrize("name", VALUES)
def test_restricted_security_context(rendered: dict[str, str], name: str) -> None:
    for pod in pod_specs(documents(rendered[name])):
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"]
            assert ctx["capabilities"]["drop"] == [
                "ALL"
            ] and ctx["seccompProfile"]["type"] == "RuntimeDefault"


def rbac_kinds(name: str, rendered: dict[str, str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for doc in documents(rendered[name]):
        out.setdefault(doc["kind"], []).append(doc)
    return out


def test_rbac_is_namespaced_when_namespaces_are_listed(rendered: dict[str, str]) -> None:
    kinds = rbac_kinds("namespaced", rendered)
    assert "ClusterRole" not in kinds
    assert sorted(r["metadata"]["namespace"] for r in kinds["Role"]) == ["llm-prod", "llm-staging"]
    rules = kinds["Role"][0]["rules"]
    assert not any("monitoring.coreos.com" in r["apiGroups"] for r in rules)
    assert not any("secrets" in r["resources"]
                   for r in rules), "the operator only references Secrets by name"
    assert not any("*" in r["verbs"] + r["resources"] for r in rules)
    assert len(rbac_kinds("default", rendered)["ClusterRole"]) == 1


def test_dashboards_carry_the_sidecar_label(rendered: dict[str, str]) -> None:
    maps = [d for d in documents(rendered["dashboards"]) if d["kind"] == "ConfigMap"]
    assert len(maps) == len(list((CHART / "dashboards").glob("*.json"))) > 0
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard_baton"] == "true"
        assert cm["metadata"]["namespace"] == "grafana"
    assert not [d for d in documents(rendered["minimal"]) if d["kind"] == "ConfigMap"]


@pytest.mark.parametrize("name", VALUES)
def test_golden(rendered: dict[str, str], name: str) -> None:
    """The whole rendering per values file; BATON_UPDATE_GOLDEN=1 rewrites them after an intended
    change."""
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("BATON_UPDATE_GOLDEN"):
        golden.write_text(rendered[name], encoding="utf-8")
        pytest.skip("golden rewritten; nothing was compared")
    expected = golden.read_text(encoding="utf-8") if golden.exists() else ""
    if rendered[name] != expected:
        diff = difflib.unified_diff(expected.splitlines(), rendered[name].splitlines(),
                                    f"golden/{name}.yaml", "rendered", lineterm="", n=2)
        pytest.fail("chart output changed (BATON_UPDATE_GOLDEN=1 accepts it):\n" +
                    "\n".join(list(diff)[:200]))


def test_gateway_metrics_are_scraped_on_their_own_port(rendered: dict[str, str]) -> None:
    """The operator gives each gateway a `metrics` container port outside its Service (see
    tests/operators/test_children.py); Prometheus scrapes gateways there and only there."""
    docs = documents(rendered["example"])
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    assert set(endpoints) == {"http", "metrics"}
    drop = endpoints["http"]["relabelings"][0]
    assert drop == {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                    "regex": "gateway", "action": "drop"}
    targets = [r["targetLabel"] for r in endpoints["metrics"]["relabelings"]]
    assert targets == ["pool", "role", "deployment"]
    policy = next(d for d in documents(rendered["namespaced"])
                  if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-gateway"))
    clients, monitoring = policy["spec"]["ingress"]
    assert clients["ports"] == [{"port": "http"}] and monitoring["ports"] == [{"port": "metrics"}]
