"""Invalid BatonDeployments: the CRD's own openAPIV3Schema refuses the structural ones (checked with
a JSON-schema validator), and the CEL rules in that schema, evaluated by the operator, catch the
rest."""
from __future__ import annotations

import copy
from typing import Any, Callable

import jsonschema
import pytest

from baton.operators import crd_schema
from baton.operators import resources as r
from baton.operators.spec import defaulted, problems

VALID: dict[str, Any] = {
    "apiVersion": r.API_VERSION,
    "kind": r.DEPLOYMENT_KIND,
    "metadata": {"name": "m"},
    "spec": {
        "model": {"huggingFace": "Qwen/Qwen3-8B"}, "image": {"worker": "baton/worker:1"},
        "pools": {"prefill": {"minReplicas": 1, "maxReplicas": 4}, "decode": {"minReplicas": 1}}
    },
}


def edit(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    body = copy.deepcopy(VALID)
    change(body["spec"])
    return body


SCHEMA_CASES = {
    "no model": edit(lambda s: s.pop("model")),
    "two model sources": edit(lambda s: s["model"].update(pvc={"claimName": "weights"})),
    "model from an object store (no downloader)":
        edit(lambda s: s.update(model={"uri": "s3://bucket/model"})),
    "pvc without claim name": edit(lambda s: s.update(model={"pvc": {"path": "/m"}})),
    "no worker image": edit(lambda s: s["image"].pop("worker")),
    "decode without prefill and no mixed": edit(lambda s: s["pools"].pop("prefill")),
    "negative min replicas": edit(lambda s: s["pools"]["prefill"].update(minReplicas=-1)),
    "too many GPUs": edit(lambda s: s["pools"]["decode"].update(gpus=64)),
    "replicas as a string": edit(lambda s: s["pools"]["decode"].update(maxReplicas="four")),
    "unknown autoscaling mode":
        edit(lambda s: s["pools"]["decode"].update(autoscaling={"mode": "turbo"})),
    "KV high mark above 100%":
        edit(lambda s: s["pools"]["decode"].update(autoscaling={"kvCacheHighPercent": 120})),
    "SLO without TPOT": edit(lambda s: s.update(slos=[{"priority": 0, "ttftMillis": 100}])),
    "SLO priority not a number (the gateway's priorities are integers)": edit(
        lambda s: s.update(slos=[{"priority": "interactive", "ttftMillis": 1, "tpotMillis": 1}])),
    "unknown router policy": edit(lambda s: s.update(router={"policy": "round-robin"})),
    "unknown KV transport": edit(lambda s: s["pools"]["decode"].update(kvTransport="tcp")),
    "API key secret without a name":
        edit(lambda s: s.update(gateway={"apiKeysSecretRef": {"key": "k"}})),
    "gateway port below 1024": edit(lambda s: s.update(gateway={"port": 80})),
    "state volume with an empty claim name":
        edit(lambda s: s.update(gateway={"stateStoreVolume": {"claimName": ""}})),
    "state volume size not a quantity":
        edit(lambda s: s.update(gateway={"stateStoreVolume": {"sizeLimit": "lots"}})),
    "toleration with a bad operator": edit(
        lambda s: s["pools"]["decode"].update(tolerations=[{"key": "gpu", "operator": "Matches"}])),
    "tensor parallelism beyond 64 ranks":
        edit(lambda s: s["pools"]["decode"].update(tensorParallelSize=128)),
    "tensor parallel size as a string":
        edit(lambda s: s["pools"]["decode"].update(tensorParallelSize="8")),
    "nodes without GPUs": edit(lambda s: s["pools"]["decode"].update(gpusPerNode=0)),
    "gatewayRef without a name": edit(lambda s: s.update(gatewayRef={})),
    "gatewayRef naming no valid object": edit(lambda s: s.update(gatewayRef={"name": "Big_One"})),
    "runtime LoRA updating as a string":
        edit(lambda s: s.update(gateway={"allowRuntimeLoraUpdating": "yes"})),
}

# Valid for the structural schema; refused by a CEL rule (or list-map key) that the operator
# evaluates itself.
RULE_CASES = {
    "min above max": (edit(lambda s: s["pools"]["prefill"].update(minReplicas=5, maxReplicas=2)),
                      "minReplicas must not exceed maxReplicas"),
    "zero min without scale to zero": (edit(lambda s: s["pools"]["decode"].update(minReplicas=0)),
                                       "minReplicas may be 0 only with autoscaling.scaleToZero"),
    "initial replicas above max": (edit(lambda s: s["pools"]["prefill"].update(replicas=9)),
                                   "replicas must lie within minReplicas..maxReplicas"),
    "KV low above high":
        (edit(lambda s: s["pools"]["decode"].update(autoscaling={"kvCacheLowPercent": 90})),
         "kvCacheLowPercent must be below kvCacheHighPercent"),
    "engine arg with dashes":
        (edit(lambda s: s["pools"]["decode"].update(engineArgs={"--max-num-seqs": "8"})),
         "engineArgs keys must be kebab-case"),
    "engine arg the operator owns":
        (edit(lambda s: s["pools"]["decode"].update(engineArgs={"model": "x"})),
         "engineArgs must not set flags the operator owns"),
    "engine arg the operator owns (the pod's identity)":
        (edit(lambda s: s["pools"]["decode"].update(engineArgs={"worker-id": "x"})),
         "engineArgs must not set flags the operator owns"),
    "duplicate SLO priority":
        (edit(lambda s: s.update(slos=[{"priority": 1, "ttftMillis": 1, "tpotMillis": 1}] * 2)),
         "duplicate entries for priority = 1"),
    "tensor parallel size not a power of two":
        (edit(lambda s: s["pools"]["decode"].update(tensorParallelSize=6)),
         "tensorParallelSize must be a power of two"),
    "a group that cannot be whole nodes (16 ranks on nodes of 6 GPUs)":
        (edit(lambda s: s["pools"]["decode"].update(tensorParallelSize=16, gpusPerNode=6)),
         "a tensorParallelSize above gpusPerNode must be a multiple of it"),
    "GPUs per replica that disagree with the ranks":
        (edit(lambda s: s["pools"]["prefill"].update(tensorParallelSize=4, gpus=2)),
         "with tensorParallelSize above 1 each rank takes one GPU"),
    "tensor parallelism on CPU":
        (edit(lambda s: s["pools"]["prefill"].update(tensorParallelSize=2, gpus=0)),
         "with tensorParallelSize above 1 each rank takes one GPU"),
    "engine arg the operator owns (tensor parallelism)":
        (edit(lambda s: s["pools"]["decode"].update(engineArgs={"tensor-parallel-size": "8"})),
         "engineArgs must not set flags the operator owns"),
    "gateway replicas sharing only a state store":
        (edit(lambda s: s.update(gateway={"replicas": 3, "stateStoreSecretRef": {"name": "pg"}})),
         "more than one gateway replica needs a shared rate-limit store"),
    "gateway replicas sharing only a rate-limit store":
        (edit(lambda s: s.update(gateway={"replicas": 3,
                                          "rateLimitStoreSecretRef": {"name": "redis"}})),
         "more than one gateway replica needs a shared state store"),
    "two gateway state stores":
        (edit(lambda s: s.update(gateway={"stateStoreSecretRef": {"name": "pg"},
                                          "stateStoreVolume": {"claimName": "state"}})),
         "are two state stores: set one"),
    "a member with a gateway of its own":
        (edit(lambda s: s.update(gatewayRef={"name": "main"}, gateway={"port": 9000})),
         "a BatonDeployment with gatewayRef runs behind that deployment's gateway"),
    "a member with SLOs of its own (its primary's gateway holds them)":
        (edit(lambda s: s.update(gatewayRef={"name": "main"},
                                 slos=[{"priority": 0, "ttftMillis": 1, "tpotMillis": 1}])),
         "set gateway, router and slos there, not here"),
}

# Placements the rules must let through: within a node, whole nodes, gpus left at 1 or matching.
PLACEABLE = {
    "four ranks in one pod": {"tensorParallelSize": 4},
    "eight ranks with gpus matching": {"tensorParallelSize": 8, "gpus": 8},
    "sixteen ranks over two nodes of eight": {"tensorParallelSize": 16},
    "eight ranks over two nodes of four": {"tensorParallelSize": 8, "gpusPerNode": 4},
    "two ranks on a node of six": {"tensorParallelSize": 2, "gpusPerNode": 6},
}


def validator() -> jsonschema.Validator:
    return jsonschema.Draft202012Validator(crd_schema.open_api_schema(r.DEPLOYMENT_KIND))


def test_valid_deployment_passes_schema_and_rules() -> None:
    validator().validate(VALID)
    assert problems(r.DEPLOYMENT_KIND, defaulted(r.DEPLOYMENT_KIND, VALID)) == []


@pytest.mark.parametrize("name", SCHEMA_CASES)
def test_schema_refuses(name: str) -> None:
    assert list(validator().iter_errors(SCHEMA_CASES[name])), f"schema accepted: {name}"


@pytest.mark.parametrize("name", RULE_CASES)
def test_rule_refuses(name: str) -> None:
    body, message = RULE_CASES[name]
    validator().validate(body)  # the structural schema alone lets it through
    found = problems(r.DEPLOYMENT_KIND, defaulted(r.DEPLOYMENT_KIND, body))
    assert len(found) == 1 and message in found[0], found


@pytest.mark.parametrize("name", PLACEABLE)
def test_placeable_tensor_parallel_pools_pass(name: str) -> None:
    body = edit(lambda s: s["pools"]["decode"].update(PLACEABLE[name]))
    validator().validate(body)
    assert problems(r.DEPLOYMENT_KIND, defaulted(r.DEPLOYMENT_KIND, body)) == []


def test_gateway_replicas_with_shared_stores_pass() -> None:
    body = edit(lambda s: s.update(gateway={"replicas": 4,
                                            "rateLimitStoreSecretRef": {"name": "redis"},
                                            "stateStoreSecretRef": {"name": "pg"}}))
    validator().validate(body)
    assert problems(r.DEPLOYMENT_KIND, defaulted(r.DEPLOYMENT_KIND, body)) == []


def test_a_member_takes_no_gateway_router_or_slo_defaults() -> None:
    """The rule that refuses a member's own gateway would refuse every member if the defaults
    filled them in; a deployment without gatewayRef still gets them."""
    member = edit(lambda s: s.update(gatewayRef={"name": "main"}))
    validator().validate(member)
    spec = defaulted(r.DEPLOYMENT_KIND, member)
    assert problems(r.DEPLOYMENT_KIND, spec) == []
    assert not {"gateway", "router", "slos"} & set(spec)
    primary = defaulted(r.DEPLOYMENT_KIND, VALID)
    assert (primary["gateway"]["port"], primary["router"]["policy"], primary["slos"]) == (
        8000, "prefix-aware", crd_schema.DEFAULT_SLOS)
    assert primary["gateway"]["allowRuntimeLoraUpdating"] is False


def test_a_workerpool_is_held_to_the_same_placement_rules() -> None:
    """A WorkerPool edited directly (kubectl edit, scale tooling) meets the rules its
    BatonDeployment's pool did."""
    spec = {"deployment": "m", "role": "decode", "replicas": 1, "model": {"huggingFace": "m/m"},
            "image": {"worker": "w"}, "tensorParallelSize": 16, "gpusPerNode": 6}
    found = problems(r.POOL_KIND, defaulted(r.POOL_KIND, {"spec": spec}))
    assert found == [".spec: a tensorParallelSize above gpusPerNode must be a multiple of it "
                     "(one whole node per pod)"]


def test_every_cel_rule_has_a_case() -> None:
    def rules(schema: Any) -> list[str]:
        if isinstance(schema, dict):
            own = [v["message"] for v in schema.get("x-kubernetes-validations", [])]
            return own + [m for value in schema.values() for m in rules(value)]
        return [m for item in schema for m in rules(item)] if isinstance(schema, list) else []
    messages = set(rules(crd_schema.open_api_schema(r.DEPLOYMENT_KIND)))
    covered = {m for m in messages for _, expected in RULE_CASES.values() if expected in m}
    assert covered == messages
