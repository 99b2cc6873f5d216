"""Several base models behind one gateway. A BatonDeployment with `gatewayRef` (a member) names
another (its primary, which has none): the member gets only its worker pools, and the primary's
router routes the member's model to them (`--additional-models`) and its gateway lists it
(`--additional-models NAME=PATH`, the member's tokenizer fetched into the gateway's pod).

Which members a primary takes is decided here alone, from what is live, so that the primary's
reconcile and each member's agree without keeping state."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from baton.operators import resources as r
from baton.operators import spec as specs
from baton.operators.kube import Kube
from baton.operators.model_source import model_mount
from baton.operators.workers import served_model_name

Obj = dict[str, Any]


@dataclass(frozen=True)
class Member:
    """A member BatonDeployment that may join its primary: the live object and its defaulted
    spec."""
    body: Obj
    spec: Obj

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def model_name(self) -> str:
        return served_model_name(self.name, self.spec["model"])


@dataclass
class GatewayModels:
    """What the gateway's pod needs for its members' models."""
    args: list[str] = field(default_factory=list)
    volumes: list[Obj] = field(default_factory=list)
    mounts: list[Obj] = field(default_factory=list)
    init_containers: list[Obj] = field(default_factory=list)


def front_name(body: Obj, spec: Obj) -> str:
    """The BatonDeployment whose router and gateway serve this one's model."""
    return (spec.get("gatewayRef") or {}).get("name") or body["metadata"]["name"]


def block_sizes(spec: Obj) -> set[str]:
    """The engineArgs block-size values a deployment's pools set (strings, as engineArgs are)."""
    return {pool.get("engineArgs", {}).get("block-size")
            for pool in spec["pools"].values()} - {None}


def router_block_size(spec: Obj) -> str | None:
    """The router's --block-size: the prefix hashes are per block, so the router cuts prompts as
    the workers do (numbers compared as numbers)."""
    sizes = block_sizes(spec)
    return min(sizes, key=int) if sizes else None


def join_problems(name: str, spec: Obj, primary: Obj | None, taken: set[str]) -> list[str]:
    """Why a member cannot join `primary` (None: not found); `taken` are the model names already
    behind its gateway."""
    ref = spec["gatewayRef"]["name"]
    if ref == name:
        return [".spec.gatewayRef: names this BatonDeployment itself"]
    if primary is None:
        return [f".spec.gatewayRef: BatonDeployment {ref!r} not found in this namespace"]
    if "gatewayRef" in (primary.get("spec") or {}):
        return [f".spec.gatewayRef: {ref!r} is itself behind "
                f"{primary['spec']['gatewayRef'].get('name')!r}'s gateway: name that one"]
    primary_spec = specs.defaulted(r.DEPLOYMENT_KIND, primary)
    if specs.problems(r.DEPLOYMENT_KIND, primary_spec):
        return [f".spec.gatewayRef: {ref!r} has an invalid spec (see its conditions)"]
    problems = []
    model = served_model_name(name, spec["model"])
    if model in taken:
        problems.append(f".spec.model: the served model name {model!r} is already behind "
                        f"{ref!r}'s gateway")
    want = router_block_size(primary_spec)
    if block_sizes(spec) - {want} or (want is not None and not block_sizes(spec)):
        problems.append(f".spec.pools: engineArgs block-size must be {ref!r}'s "
                        f"({want or 'unset'}), the block size its router hashes prompts by")
    return problems


def split_members(primary: Obj,
                  candidates: Sequence[Obj]) -> tuple[list[Member], dict[str, list[str]]]:
    """The members of `primary` among `candidates` (the namespace's live BatonDeployments): those
    that join, by name (first come by name keeps a model name), and the problems of the rest."""
    name = primary["metadata"]["name"]
    taken = {served_model_name(name, primary["spec"]["model"])}
    joined, refused = [], {}
    for body in sorted(candidates, key=lambda b: b["metadata"]["name"]):
        spec = specs.defaulted(r.DEPLOYMENT_KIND, body)
        if (spec.get("gatewayRef") or {}).get("name") != name:
            continue
        problems = specs.problems(r.DEPLOYMENT_KIND, spec) or join_problems(
            body["metadata"]["name"], spec, primary, taken)
        if problems:
            refused[body["metadata"]["name"]] = problems
            continue
        member = Member(body, spec)
        taken.add(member.model_name)
        joined.append(member)
    return joined, refused


async def find_members(kube: Kube, primary: Obj,
                       leaving: str | None = None) -> tuple[list[Member], dict[str, list[str]]]:
    """`split_members` over what is live; a member being deleted (or `leaving`) has left."""
    live = await kube.list(r.DEPLOYMENT_KIND, primary["metadata"]["namespace"], {})
    present = [b for b in live if not b["metadata"].get("deletionTimestamp")
               and b["metadata"]["name"] != leaving]
    return split_members(primary, present)


def router_models(members: Sequence[Member]) -> list[str]:
    return ["--additional-models", *(m.model_name for m in members)] if members else []


def gateway_models(members: Sequence[Member], image: str, pull_policy: str) -> GatewayModels:
    """Each member's tokenizer and chat template, fetched (or mounted) into a folder of its own."""
    out = GatewayModels()
    for index, member in enumerate(members, start=1):
        source = model_mount(member.spec["model"], image, pull_policy, tokenizer_only=True,
                             slot=f"-{index}")
        out.args.append(f"{member.model_name}={source.path}")
        # The cache volume and HF_HOME are the primary's, shared.
        out.volumes += [v for v in source.volumes if v["name"] != "cache"]
        out.mounts += [m for m in source.mounts if m["name"] != "cache"]
        out.init_containers += source.init_containers
    if members:
        out.args.insert(0, "--additional-models")
    return out
