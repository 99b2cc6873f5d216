"""What the gateway tells about itself: with auth on, /metrics, the OpenAPI schema and the docs
pages take an API key (/health and /ready stay open for probes); with a metrics port, /metrics is
served there, without a key, and not on the API port; tenant labels can be hashed or turned off."""
from __future__ import annotations

import hashlib

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry

from baton.services.common.process import ServiceProcess, free_port
from baton.services.gateway.metrics import GatewayMetrics
from tests.launcher import launch_gateway, stop_all, wait_for

KEYS = 'tenants:\n  - name: acme-corp\n    keys: ["sk-acme"]\n'
KEYED = ["/metrics", "/openapi.json", "/docs", "/redoc"]
ACME_DIGEST = hashlib.sha256(b"acme-corp").hexdigest()[:12]
OTHER_DIGEST = hashlib.sha256(b"other").hexdigest()[:12]


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    """Both with keys and no router: one serving /metrics on its API port, one on a metrics port
    with tenant labels hashed."""
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(KEYS)
    metrics_port = free_port()
    router = f"127.0.0.1:{free_port()}"
    started: list[tuple[ServiceProcess, int]] = [
        launch_gateway("gateway", router, f"--api-keys-file={keys}"),
        launch_gateway("gateway-metrics-port", router, f"--api-keys-file={keys}",
                       f"--metrics-port={metrics_port}", "--tenant-metrics-label=hash")
    ]
    try:
        for service, _ in started:
            service.wait_ready()
        yield {"api": started[0][1], "split": started[1][1], "metrics": metrics_port}
    finally:
        stop_all([service for service, _ in started])


def get(port: int, path: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"http://127.0.0.1:{port}{path}", headers=headers, timeout=10)


@pytest.mark.parametrize("path", KEYED)
def test_self_description_takes_a_key(gateways, path):
    for key in (None, "sk-wrong"):
        refused = get(gateways["api"], path, key)
        assert refused.status_code == 401, (path, key, refused.text)
        assert refused.json()["error"]["code"] == "invalid_api_key"
    assert get(gateways["api"], path, "sk-acme").status_code == 200


def test_probes_need_no_key(gateways):
    assert get(gateways["api"], "/health").status_code == 200
    assert get(gateways["api"], "/ready").status_code == 503  # no router, but not 401


def test_a_metrics_port_serves_metrics_without_a_key_and_the_api_port_none(gateways):
    assert get(gateways["split"], "/metrics", "sk-acme").status_code == 404
    assert get(gateways["split"], "/openapi.json", "sk-acme").status_code == 200
    assert get(gateways["metrics"], "/metrics").status_code == 200
    assert get(gateways["metrics"], "/health").status_code == 200
    assert get(gateways["metrics"], "/ready").status_code == 503  # as the API port's: no router


def test_hashed_tenant_labels_name_no_tenant(gateways):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateways['split']}/v1", api_key="sk-acme",
                           max_retries=0)
    with pytest.raises(openai.APIStatusError):  # no router: refused, but metered
        client.completions.create(model="tiny-llama", prompt="hello", max_tokens=1)

    def scraped() -> str:
        return get(gateways["metrics"], "/metrics").text

    wait_for(lambda: f'baton_tenant_prompt_tokens_total{{tenant="{ACME_DIGEST}"}}' in scraped(),
             what="the hashed tenant's series")
    assert "acme" not in scraped()


@pytest.mark.parametrize("mode, expected", [("name", {"acme-corp": 3, "other": 4}),
                                            ("hash", {ACME_DIGEST: 3, OTHER_DIGEST: 4}),
                                            ("off", {"all": 7})])
def test_tenant_label_modes(mode, expected):
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, mode)
    for tenant, tokens in (("acme-corp", 3), ("other", 4)):
        metrics.prompt_tokens.labels(metrics.tenant(tenant)).inc(tokens)
    series = {sample.labels["tenant"]: sample.value for family in registry.collect()
              for sample in family.samples if sample.name == "baton_tenant_prompt_tokens_total"}
    assert series == expected
