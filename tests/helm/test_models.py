"""Several base models behind one gateway from the chart: `example.additionalModels` renders member
BatonDeployments (gatewayRef: the example), valid against the CRD; turned into workloads by the
operator's own rendering they give each model its pools, workers serving that model, Services the
router's selector matches, a router routing every model and a gateway listing each with its
tokenizer. The gateway's runtime LoRA flag comes from `example.spec.gateway`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from baton.operators import crd_schema
from baton.operators import resources as r
from baton.operators.children import all_children
from baton.operators.members import split_members
from baton.operators.pools import pool_objects
from baton.operators.settings import OperatorSettings
from baton.operators.spec import defaulted, problems
from tests.helm.conftest import CHART, NAMESPACE, RELEASE, REPO, documents, run_helm

SETTINGS = OperatorSettings()
# Model name -> the pools the models values give it.
POOLS = {"qwen": ["qwen-prefill", "qwen-decode"], "coder": ["coder-mixed"],
         "llama": ["llama-prefill", "llama-decode"]}


def deployments(rendered: str) -> dict[str, dict[str, Any]]:
    found = {}
    for doc in documents(rendered):
        if doc["kind"] == r.DEPLOYMENT_KIND:
            doc["metadata"]["uid"] = f"uid-{doc['metadata']['name']}"
            found[doc["metadata"]["name"]] = doc
    return found


def made(rendered: str) -> dict[str, dict[str, Any]]:
    """(kind, name) -> what the operator makes for the rendered primary and its members."""
    bodies = deployments(rendered)
    primary = bodies["qwen"]
    members, refused = split_members(primary, list(bodies.values()))
    assert refused == {}
    out = {}
    for child in all_children(primary, defaulted(r.DEPLOYMENT_KIND, primary), SETTINGS, members):
        out[(child["kind"], child["metadata"]["name"])] = child
        if child["kind"] == r.POOL_KIND:
            child["metadata"]["uid"] = "pool-uid"
            pool = {**child, "spec": defaulted(r.POOL_KIND, child)}
            for obj in pool_objects(pool, SETTINGS, monitors=False):
                out[(obj["kind"], obj["metadata"]["name"])] = obj
    return out


def args(deployment: dict[str, Any]) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def after(flags: list[str], flag: str) -> list[str]:
    """The words after `flag` up to the next flag."""
    rest = flags[flags.index(flag) + 1:]
    return rest[:next((i for i, word in enumerate(rest) if word.startswith("--")), len(rest))]


def test_members_render_valid_and_behind_the_example(rendered: dict[str, str]) -> None:
    bodies = deployments(rendered["models"])
    assert set(bodies) == set(POOLS)
    schema = crd_schema.open_api_schema(r.DEPLOYMENT_KIND)
    for name, doc in bodies.items():
        jsonschema.Draft202012Validator(schema).validate(doc)
        assert problems(r.DEPLOYMENT_KIND, defaulted(r.DEPLOYMENT_KIND, doc)) == [], name
        assert doc["spec"].get("gatewayRef") == (None if name == "qwen" else {"name": "qwen"})


def test_each_model_gets_its_pools_behind_one_router_and_gateway(
        rendered: dict[str, str]) -> None:
    objects = made(rendered["models"])
    router = args(objects[("Deployment", "qwen-router")])
    assert (after(router, "--model"), after(router, "--additional-models")) == (
        ["qwen"], ["coder", "llama"])
    gateway = args(objects[("Deployment", "qwen-gateway")])
    assert after(gateway, "--additional-models") == [
        "coder=/models-1/qwen2.5-coder-7b", "llama=/models-2/meta-llama--Llama-3.1-8B-Instruct"]
    # Only the primary has a router and a gateway.
    assert {name for kind, name in objects if kind == "Deployment" and
            name.endswith(("-router", "-gateway"))} == {"qwen-router", "qwen-gateway"}
    selector = dict(term.partition("=")[::2] for term in
                    after(router, "--kube-label-selector")[0].split(","))
    for model, pools in POOLS.items():
        for pool in pools:
            service = objects[("Service", pool)]["metadata"]["labels"]
            # Each term of the selector: the label's value, or (no value) that the label exists.
            assert all(key in service and (not value or service[key] == value)
                       for key, value in selector.items()), pool
            worker = args(objects[("Deployment", pool)])
            assert after(worker, "--served-model-name") == [model], pool
    assert [k for k in objects if k[0] == r.POOL_KIND] == [
        (r.POOL_KIND, pool) for pools in POOLS.values() for pool in pools]


def test_a_members_tokenizer_reaches_the_gateway_pod(rendered: dict[str, str]) -> None:
    pod = made(rendered["models"])[("Deployment", "qwen-gateway")]["spec"]["template"]["spec"]
    assert {"name": "model-1", "persistentVolumeClaim": {"claimName": "coder-weights",
                                                         "readOnly": True}} in pod["volumes"]
    fetch = {c["name"]: c for c in pod["initContainers"]}
    assert fetch["fetch-model-2"]["command"][3] == "meta-llama/Llama-3.1-8B-Instruct"
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "hf-token", "key": "token"}}} in fetch["fetch-model-2"]["env"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/models", "/models-1", "/models-2"} <= mounts


def test_runtime_lora_updating_is_a_gateway_value(rendered: dict[str, str]) -> None:
    assert "--allow-runtime-lora-updating" in args(
        made(rendered["models"])[("Deployment", "qwen-gateway")])
    example = deployments(rendered["example"])["qwen"]
    example_gateway = next(c for c in all_children(example, defaulted(
        r.DEPLOYMENT_KIND, example), SETTINGS) if c["metadata"]["name"] == "qwen-gateway")
    assert "--allow-runtime-lora-updating" not in args(example_gateway)
    decode = args(made(rendered["models"])[("Deployment", "qwen-decode")])
    assert "--enable-lora" in decode and "true" not in decode


def test_the_guides_member_example_joins_the_guides_primary() -> None:
    guide = (REPO / "docs" / "operator.md").read_text()
    shown = guide.split("## Several base models", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    coder = yaml.safe_load((REPO / "examples" / "coder.yaml").read_text())
    qwen = yaml.safe_load((REPO / "examples" / "qwen.yaml").read_text())
    assert yaml.safe_load(shown) == coder
    jsonschema.Draft202012Validator(crd_schema.open_api_schema(r.DEPLOYMENT_KIND)).validate(coder)
    joined, refused = split_members(qwen, [qwen, coder])
    assert [m.name for m in joined] == ["coder"] and refused == {}


@pytest.mark.parametrize("member, message", [
    ({"name": "qwen", "spec": {}}, 'the name "qwen" is taken'),
    ({"name": "coder", "spec": {"slos": []}}, 'sets spec.slos'),
    ({"name": "coder", "spec": {"gateway": {"port": 9000}}}, 'sets spec.gateway'),
])
def test_the_chart_refuses_a_member_it_cannot_serve(helm: str, tmp_path: Path,
                                                    member: dict[str, Any], message: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"example": {"enabled": True, "name": "qwen",
                                                  "additionalModels": [member]}}))
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f",
                      str(values))
    assert result.returncode != 0 and message in result.stderr, result.stderr
