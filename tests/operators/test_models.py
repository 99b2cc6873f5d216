"""Several base models behind one gateway, through the operator against kmock: a member
BatonDeployment (gatewayRef) gets worker pools only, labelled for its primary's router; the
primary's router routes the member's model and selects its workers, its gateway lists the model
with the member's tokenizer; moving the member to another primary or deleting it takes its model
away again; a member that cannot join is Degraded and changes nothing. Which members join (a name
taken, block sizes, chains) is a pure function, tested without the operator."""
from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from typing import Any

import pytest

from baton.operators import resources as r
from baton.operators.members import join_problems, split_members
from baton.operators.spec import defaulted
from tests.operators.conftest import NAMESPACE, Operator
from tests.operators.test_operator import body, create, flags

pytestmark = pytest.mark.asyncio

# One pool each keeps the emulated cluster's work (and the test's time) small.
PRIMARY = {
    "model": {"huggingFace": "Qwen/Qwen3-8B"}, "image": {"worker": "baton/worker:1"},
    "slos": [{"priority": 0, "ttftMillis": 800, "tpotMillis": 40}],
    "pools": {"mixed": {"minReplicas": 1, "maxReplicas": 2}},
}
MEMBER_SPEC = {
    "gatewayRef": {"name": "qwen"},
    "model": {"pvc": {"claimName": "coder-weights", "path": "/coder"},
              "servedModelName": "coder"},
    "image": {"worker": "baton/worker:2"},
    "pools": {"mixed": {"minReplicas": 2, "maxReplicas": 3}},
}


def member(name: str = "coder", **changes: Any) -> dict[str, Any]:
    return body(name, {**copy.deepcopy(MEMBER_SPEC), **changes})


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def serves(model: str) -> Any:
    return lambda d: model in container(d)["args"]


# A primary and a member each reconcile the shared router and gateway; on a loaded machine against
# the emulator that takes seconds, so conditions are polled for with a generous deadline.
DEADLINE_S = 120.0


async def wait_for(op: Operator, kind: str, name: str,
                   check: Callable[[dict[str, Any]], Any] = bool) -> dict[str, Any]:
    last: dict[str, Any] = {}
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        last = await op.kube.get(kind, NAMESPACE, name) or {}
        if last and check(last):
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{kind}/{name} never matched; last seen: {last}")


async def gone(op: Operator, kind: str, name: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if await op.kube.get(kind, NAMESPACE, name) is None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{kind}/{name} survived")


async def degraded(op: Operator, name: str) -> dict[str, Any]:
    live = await wait_for(op, r.DEPLOYMENT_KIND, name, lambda o: any(
        c["type"] == "Degraded" and c["status"] == "True"
        for c in o.get("status", {}).get("conditions", [])))
    return next(c for c in live["status"]["conditions"] if c["type"] == "Degraded")


async def test_a_member_joins_moves_and_leaves(operator: Operator) -> None:
    await create(operator, body(spec=PRIMARY))
    await create(operator, member())
    router = container(await wait_for(operator, "Deployment", "qwen-router", serves("coder")))
    assert flags(router["args"], "--model", "--additional-models", "--kube-label-selector") == [
        "qwen", "coder", f"{r.LABEL_GATEWAY}=qwen,{r.LABEL_ROLE}"]
    gateway = await wait_for(operator, "Deployment", "qwen-gateway",
                             serves("coder=/models-1/coder"))
    assert flags(container(gateway)["args"], "--additional-models") == ["coder=/models-1/coder"]
    assert {"name": "model-1", "persistentVolumeClaim": {
        "claimName": "coder-weights", "readOnly": True}} in gateway["spec"]["template"]["spec"][
            "volumes"]
    pool = await wait_for(operator, "WorkerPool", "coder-mixed")
    assert pool["metadata"]["ownerReferences"][0]["name"] == "coder"
    assert (pool["spec"]["gateway"], pool["spec"]["routerUrl"], pool["spec"]["slos"]) == (
        "qwen", "http://qwen-router:9100", PRIMARY["slos"])
    service = await wait_for(operator, "Service", "coder-mixed")
    # The router's selector (gateway label and role label present) matches the member's Service.
    assert service["metadata"]["labels"][r.LABEL_GATEWAY] == "qwen"
    assert service["metadata"]["labels"][r.LABEL_ROLE] == "mixed"
    worker = container(await wait_for(operator, "Deployment", "coder-mixed"))
    assert flags(worker["args"], "--served-model-name", "--model") == ["coder", "/models/coder"]
    for kind, name in [("Deployment", "coder-router"), ("Deployment", "coder-gateway")]:
        assert await operator.kube.get(kind, NAMESPACE, name) is None

    # Moving to another gateway leaves the first one.
    await create(operator, body("other", copy.deepcopy(PRIMARY)))
    await operator.kube.patch(r.DEPLOYMENT_KIND, NAMESPACE, "coder",
                              {"spec": {"gatewayRef": {"name": "other"}}})
    await wait_for(operator, "Deployment", "other-router", serves("coder"))
    await wait_for(operator, "Service", "coder-mixed",
                   lambda s: s["metadata"]["labels"][r.LABEL_GATEWAY] == "other")
    gateway = await wait_for(operator, "Deployment", "qwen-gateway",
                             lambda d: "--additional-models" not in container(d)["args"])
    assert "model-1" not in {v["name"] for v in gateway["spec"]["template"]["spec"]["volumes"]}
    assert "--additional-models" not in container(
        await wait_for(operator, "Deployment", "qwen-router"))["args"]

    await operator.kube.delete(r.DEPLOYMENT_KIND, NAMESPACE, "coder")
    await wait_for(operator, "Deployment", "other-router",
                   lambda d: "--additional-models" not in container(d)["args"])
    await wait_for(operator, "Deployment", "other-gateway",
                   lambda d: "--additional-models" not in container(d)["args"])
    await gone(operator, "WorkerPool", "coder-mixed")


async def test_a_member_without_its_primary_is_degraded_until_it_appears(
        operator: Operator) -> None:
    await create(operator, member())
    condition = await degraded(operator, "coder")
    assert condition["reason"] == "GatewayNotFound" and "'qwen' not found" in condition["message"]
    assert await operator.kube.get("WorkerPool", NAMESPACE, "coder-mixed") is None
    # The primary takes in the member that waited for it.
    await create(operator, body(spec=PRIMARY))
    await wait_for(operator, "Deployment", "qwen-router", serves("coder"))
    await wait_for(operator, "WorkerPool", "coder-mixed")


def test_a_member_whose_model_name_is_taken_stays_out() -> None:
    clash = member("again", model={"huggingFace": "Qwen/Qwen3-0.6B", "servedModelName": "qwen"})
    joined, refused = split_members(body(spec=PRIMARY), [member(), clash, body("other")])
    assert [m.name for m in joined] == ["coder"]
    assert refused == {"again": [".spec.model: the served model name 'qwen' is already behind "
                                 "'qwen''s gateway"]}
    # First come by name keeps a name two members want.
    twin = member("coder-2", model=MEMBER_SPEC["model"])
    joined, refused = split_members(body(spec=PRIMARY), [twin, member()])
    assert [m.name for m in joined] == ["coder"] and list(refused) == ["coder-2"]


@pytest.mark.parametrize("primary_size, member_size, joins", [
    (None, None, True), ("32", "32", True), ("32", None, False), (None, "32", False),
    ("16", "32", False)])
def test_a_member_must_hash_blocks_as_the_router_does(primary_size: str | None,
                                                       member_size: str | None,
                                                       joins: bool) -> None:
    primary, coder = body(spec=PRIMARY), member()
    if primary_size:
        primary["spec"]["pools"]["mixed"]["engineArgs"] = {"block-size": primary_size}
    if member_size:
        coder["spec"]["pools"]["mixed"]["engineArgs"] = {"block-size": member_size}
    joined, refused = split_members(primary, [coder])
    assert bool(joined) == joins
    if not joins:
        assert f"must be 'qwen''s ({primary_size or 'unset'})" in refused["coder"][0]


def test_a_member_of_a_member_or_of_itself_is_refused() -> None:
    spec = defaulted(r.DEPLOYMENT_KIND, member())
    assert "names this BatonDeployment itself" in join_problems("qwen", spec, None, set())[0]
    assert "is itself behind 'main''s gateway" in join_problems(
        "coder", spec, member("qwen", gatewayRef={"name": "main"}), set())[0]

