"""Mixed tenants for `baton bench overload --tenants`: several API-key tenants at different
priorities share one open-loop load, so a run shows what overload does to each priority band and to
tenants of equal priority.

A tenant is `NAME:PRIORITY:SHARE` (share of the run's request rate); `mixed` is a high-priority
tenant, two standard tenants of equal priority and equal rate (token fairness should split their
service evenly) and a sheddable one. Each tenant sends its own Poisson stream with its own API key;
the gateway maps the key to the tenant and its priority from a keys file the bench writes for the
run. Tenants of equal priority send the same sequence of request sizes (their arrival times differ;
the gateway salts each tenant's prefix cache apart), so in a short run with long-tailed lengths what
sets their shares apart is the stack, not the draw.
"""
from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from baton.loadtest.arrivals import gamma_arrivals
from baton.loadtest.client import Target
from baton.loadtest.runner import RunResult, run_open_loop, schedule
from baton.loadtest.scenarios import WorkloadSpec, iter_requests
from baton.loadtest.stats import OK, SLO, summarize

PRESETS = {"mixed": "high:1:0.2,std-a:0:0.3,std-b:0:0.3,batch:-1:0.2"}
TENANT_SEED_STRIDE = 7907  # each tenant draws its own arrivals and prompts


@dataclass(frozen=True)
class TenantLoad:
    name: str
    priority: int
    share: float

    @property
    def key(self) -> str:
        return f"sk-bench-{self.name}"


def parse_tenants(text: str) -> list[TenantLoad]:
    """`NAME:PRIORITY:SHARE,...` or a preset's name; shares are normalised to sum to 1."""
    items = [item.split(":") for item in PRESETS.get(text, text).split(",") if item]
    if not items or any(len(i) != 3 for i in items):
        raise ValueError(
            f"--tenants wants NAME:PRIORITY:SHARE,... or one of {sorted(PRESETS)}, not {text!r}")
    tenants = [TenantLoad(name, int(priority), float(share)) for name, priority, share in items]
    total = sum(t.share for t in tenants)
    if total <= 0 or any(t.share < 0 for t in tenants) or len({t.name
                                                               for t in tenants}) < len(tenants):
        raise ValueError(
            f"--tenants {text!r}: shares must be non-negative with a positive sum, names unique")
    return [dataclasses.replace(t, share=t.share / total) for t in tenants]


def write_keys_file(tenants: list[TenantLoad], path: Path) -> Path:
    """The gateway's tenants file (services/gateway/tenants.py's format) for these tenants."""
    doc = {"tenants": [{"name": t.name, "keys": [t.key], "priority": t.priority} for t in tenants]}
    path.write_text(yaml.safe_dump(doc))
    return path


def slo_priority(tenants: list[TenantLoad] | None) -> int:
    """The priority to key the gateway's SLO at: a priority without its own target inherits the
    nearest lower one's, so keying it at the lowest priority in the mix gives every tenant the same
    targets."""
    return min([0, *(t.priority for t in tenants or [])])


async def run_tenants(url: str, model: str, tenants: list[TenantLoad], spec: WorkloadSpec,
                      rate: float, duration_s: float,
                      drain_timeout_s: float) -> dict[str, RunResult]:
    """Every tenant's open-loop stream at its share of `rate`, all at once against the same
    gateway."""
    band = {p: i for i, p in enumerate(sorted({t.priority for t in tenants}))}

    async def one(i: int, tenant: TenantLoad) -> RunResult:
        sizes = iter_requests(
            dataclasses.replace(spec, seed=spec.seed + band[tenant.priority] * TENANT_SEED_STRIDE))
        times = gamma_arrivals(rate * tenant.share, duration_s, 1.0,
                               spec.seed + (i + 1) * TENANT_SEED_STRIDE + 1)
        plan = schedule(times, sizes)
        return await run_open_loop(Target(url, model, tenant.key), plan, duration_s,
                                   drain_timeout_s, False)

    results = await asyncio.gather(*(one(i, t) for i, t in enumerate(tenants) if t.share > 0))
    return {t.name: r for t, r in zip([t for t in tenants if t.share > 0], results)}


def tenant_points(runs: dict[str, RunResult], slo: SLO) -> dict[str, dict]:
    """Per tenant, the loadtest point `bench_overload.figures` reads, plus the tokens it was served
    (prompt and output of its answered requests: what token fairness shares out). Every tenant's
    goodput is over the same span, the whole run's, so tenants compare."""
    span = max(r.duration_s for r in runs.values())
    points = {}
    for name, run in runs.items():
        served = sum(r.prompt_tokens + r.output_tokens for r in run.results if r.status == OK)
        points[name] = {"summary": summarize(run.results, span, slo), "served_tokens": served,
                        "requests": [dataclasses.asdict(r) for r in run.results]}
    return points


def tenant_verdict(rows: list[dict]) -> list[str]:
    """What the mix should show at each load with admission on: the top priority's attainment at
    least every lower band's, sheddable tenants refused at least as often as any other, and
    equal-priority tenants served evenly."""
    lines = []
    for load in dict.fromkeys(r["load"] for r in rows if r["admission"] == "on"):
        at = [r for r in rows if r["load"] == load and r["admission"] == "on"]
        top = max(at, key=lambda r: r["priority"])
        lowest = min(r["attainment"] or 0.0 for r in at)
        lines.append(
            f"{load}: {top['tenant']} (priority {top['priority']}) attainment "
            f"{top['attainment']:.0%}, "
            f"lowest of any tenant {lowest:.0%}")
        refused = {r["tenant"]: r["refused"] / r["sent"] for r in at if r["sent"]}
        shed = [t for t in refused if next(r for r in at if r["tenant"] == t)["priority"] < 0]
        if shed and len(shed) < len(refused):
            kept = max(v for t, v in refused.items() if t not in shed)
            lines.append(
                f"{load}: sheddable refused {min(refused[t] for t in shed):.0%} of sent, "
                "others at most "
                f"{kept:.0%}")
        for priority in {r["priority"] for r in at}:
            peers = [r for r in at if r["priority"] == priority]
            tokens = [r["served_tokens"] for r in peers]
            if len(peers) >= 2 and max(tokens):
                shares = ", ".join(f"{r['attainment'] or 0.0:.0%}" for r in peers)
                lines.append(
                    f"{load}: priority {priority} tenants' attainment {shares}; served tokens "
                    "least/most "
                    f"{min(tokens) / max(tokens):.2f}")
    return lines
