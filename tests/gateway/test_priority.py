"""A request's `priority` (vLLM's meaning: lower is served earlier) outside the allowed range is a
400 naming it, streamed or not, and leaves nothing in flight (it used to hang the request forever);
within the range it moves its tenant's priority only inside the tenant's band, so a client cannot
outrank the tiers the operator set; the default tenant's band (--no-auth) comes from the gateway's
settings. The priority a request ran at shows in the SLO counter's label (every priority from 0 up
has the default target)."""
from __future__ import annotations

import httpx
import pytest

from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.server import build_gateway
from baton.services.gateway.tenants import KeyStore, Tenant
from baton.services.openai.errors import ProtocolError

ALPHA = {"Authorization": "Bearer sk-alpha"}  # priority 0, the default band: up to 0
BANDED = {"Authorization": "Bearer sk-banded"}  # priority 1, band [-2, 3]
SLO_REQUESTS = "baton_slo_requests_total"


@pytest.fixture(scope="module")
def http(disaggregated):
    with httpx.Client(base_url=disaggregated.url, timeout=20) as client:
        yield client


@pytest.mark.parametrize("priority", [10**20, -(2**31) - 1, 2**31, 1001, -1_000_000])
@pytest.mark.parametrize("stream", [False, True])
def test_a_priority_out_of_range_is_a_400_and_nothing_stays_in_flight(http, disaggregated,
                                                                      priority, stream):
    body = {"prompt": "hello", "max_tokens": 2, "priority": priority, "stream": stream}
    response = http.post("/completions", json=body, headers=ALPHA, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "priority" and "priority" in error["message"]
    assert disaggregated.gateway_metric("baton_gateway_requests_in_flight") == 0


def _ran_at(http, stack, headers: dict[str, str], priority: int) -> set[str]:
    """The priority labels whose SLO count one request with this `priority` field moved."""
    labels = ("-2", "-1", "0", "1", "2", "3", "5", "11")
    before = {p: stack.gateway_metric(SLO_REQUESTS, priority=p) for p in labels}
    response = http.post("/completions", headers=headers,
                         json={"prompt": "hello", "max_tokens": 2, "priority": priority})
    assert response.status_code == 200, response.text
    return {p for p in labels if stack.gateway_metric(SLO_REQUESTS, priority=p) > before[p]}


def test_a_client_cannot_raise_its_requests_above_its_tenant(http, disaggregated):
    # -5 asks to be served five places earlier: without a band it would have run at 5
    assert _ran_at(http, disaggregated, ALPHA, -5) == {"0"}
    assert _ran_at(http, disaggregated, ALPHA, 0) == {"0"}


def test_a_tenant_band_bounds_what_its_requests_may_ask(http, disaggregated):
    assert _ran_at(http, disaggregated, BANDED, -10) == {"3"}  # 11, clamped to the band's top
    assert _ran_at(http, disaggregated, BANDED, -1) == {"2"}
    assert _ran_at(http, disaggregated, BANDED, 0) == {"1"}


def test_priority_for_clamps_to_the_band_and_refuses_beyond_the_limit():
    plain, banded = Tenant("a", priority=2), Tenant("b", priority=0, min_priority=-3,
                                                     max_priority=4)
    assert [plain.priority_for(p, 100) for p in (-50, 0, 7, 100)] == [2, 2, -5, -98]
    assert [banded.priority_for(p, 100) for p in (-100, -2, 2, 100)] == [4, 2, -2, -3]
    for bad in (101, -101, 10**20):
        with pytest.raises(ProtocolError, match="priority must be between -100 and 100") as e:
            plain.priority_for(bad, 100)
        assert (e.value.status, e.value.param) == (400, "priority")


def test_the_keys_file_gives_bands_and_refuses_one_that_excludes_the_priority(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text('tenants:\n  - {name: a, keys: [k], priority: 1, min_priority: -2, '
                    'max_priority: 3}\n  - {name: b, keys: [j], priority: -1}\n')
    store = KeyStore.load(keys)
    a, b = store.tenant_for("Bearer k"), store.tenant_for("Bearer j")
    assert (a.min_priority, a.max_priority) == (-2, 3)
    assert (b.min_priority, b.max_priority) == (None, None)
    for band in ("priority: 5, max_priority: 3", "priority: 0, min_priority: 1",
                 "priority: 2000000000"):
        keys.write_text(f"tenants:\n  - {{name: c, keys: [k], {band}}}\n")
        with pytest.raises(ValueError, match="tenant 'c'"):
            KeyStore.load(keys)


@pytest.mark.asyncio
async def test_the_default_tenant_band_comes_from_the_settings() -> None:
    gateway = build_gateway(GatewayConfig(auth=False, router="127.0.0.1:1",
                                          default_min_priority=-4, default_max_priority=2))
    tenant = gateway.default_tenant()
    assert [tenant.priority_for(p, 1000) for p in (-9, -1, 0, 3, 9)] == [2, 1, 0, -3, -4]
    unbounded = build_gateway(GatewayConfig(auth=False, router="127.0.0.1:1")).default_tenant()
    assert [unbounded.priority_for(p, 1000) for p in (-9, 0, 1000)] == [0, 0, -1000]
