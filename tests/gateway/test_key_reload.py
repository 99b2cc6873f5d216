"""API keys reload without a restart: a key removed from the file stops working once the gateway
sees the change (it polls the file's content; the file is a Kubernetes-style Secret mount, whose
update swaps a symlinked directory) or at once on SIGHUP. A bad file keeps the keys in force, with
one error logged and counted. No router runs: a request with a good key gets 503 (nothing to place
it on), one with a bad key 401."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import openai
import pytest

from baton.services.common.process import ServiceProcess, free_port
from baton.services.gateway.tenants import parse_keys
from tests.launcher import launch_gateway, scrape, stop_all, wait_for

BOTH = 'tenants:\n  - name: alpha\n    keys: ["sk-alpha"]\n  - name: beta\n    keys: ["sk-beta"]\n'
ALPHA_ONLY = 'tenants:\n  - name: alpha\n    keys: ["sk-alpha"]\n'
POLL_S = 0.2


class SecretMount:
    """A folder laid out as the kubelet mounts a Secret: keys.yaml -> ..data/keys.yaml, ..data ->
    a timestamped folder; an update writes a new folder and swaps ..data."""

    def __init__(self, root: Path) -> None:
        self.root, self.versions = root, 0
        self.write(BOTH)
        (root / "keys.yaml").symlink_to("..data/keys.yaml")

    @property
    def path(self) -> Path:
        return self.root / "keys.yaml"

    def write(self, text: str) -> None:
        self.versions += 1
        version = self.root / f"..2026_v{self.versions}"
        version.mkdir()
        (version / "keys.yaml").write_text(text)
        (self.root / "..data_tmp").symlink_to(version.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    """One gateway that polls its keys file quickly, one that reloads only on SIGHUP (its poll is
    an hour)."""
    polled = SecretMount(tmp_path_factory.mktemp("polled"))
    hangup = SecretMount(tmp_path_factory.mktemp("hangup"))
    started = []
    for mount, interval in ((polled, POLL_S), (hangup, 3600)):
        metrics_port = free_port()
        service, port = launch_gateway(
            "gateway", f"127.0.0.1:{free_port()}", f"--api-keys-file={mount.path}",
            f"--api-keys-poll-interval-s={interval}", f"--metrics-port={metrics_port}")
        started.append((service, port, metrics_port, mount))
    try:
        for service, *_ in started:
            service.wait_ready()
        yield started
    finally:
        stop_all([s for s, *_ in started])


def status(port: int, key: str) -> int:
    """The HTTP status of a completion: 503 (no router) once the key is accepted, 401 if not."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
    try:
        client.completions.create(model="tiny-llama", prompt="hello", max_tokens=1)
    except openai.APIStatusError as e:
        return e.status_code
    return 200


def reloads(metrics_port: int, result: str) -> float:
    return scrape(f"http://127.0.0.1:{metrics_port}/metrics", "baton_gateway_api_key_reloads_total",
                  result=result)


def errors_logged(service: ServiceProcess) -> int:
    return sum("API keys not reloaded" in line for line in service.output)


def test_a_removed_key_stops_working_once_the_secret_changes(gateways):
    service, port, metrics_port, mount = gateways[0]
    assert status(port, "sk-beta") == 503 and status(port, "sk-alpha") == 503
    mount.write(ALPHA_ONLY)
    wait_for(lambda: status(port, "sk-beta") == 401, timeout=10, what="beta's key refused")
    assert status(port, "sk-alpha") == 503
    assert reloads(metrics_port, "ok") == 1
    assert any("API keys reloaded" in line and "1 tenants, 1 keys" in line
               for line in service.output), service.log()


def test_a_bad_file_keeps_the_keys_in_force_and_is_reported_once(gateways):
    service, port, metrics_port, mount = gateways[0]
    before = reloads(metrics_port, "error")
    mount.write('tenants:\n  - name: alpha\n    keys: ["sk-alpha", "sk-secret-new\n')
    wait_for(lambda: reloads(metrics_port, "error") == before + 1, timeout=10, what="error counted")
    time.sleep(10 * POLL_S)  # many polls of the same bad file
    assert reloads(metrics_port, "error") == before + 1 and errors_logged(service) == 1
    assert "sk-secret-new" not in service.log()
    assert status(port, "sk-alpha") == 503
    mount.write(BOTH)
    wait_for(lambda: status(port, "sk-beta") == 503, timeout=10, what="beta's key back")


def test_sighup_reloads_at_once(gateways):
    service, port, metrics_port, mount = gateways[1]
    assert status(port, "sk-beta") == 503
    mount.write(ALPHA_ONLY)
    assert status(port, "sk-beta") == 503  # not polled for an hour
    service.process.send_signal(signal.SIGHUP)
    wait_for(lambda: status(port, "sk-beta") == 401, timeout=10, what="beta's key refused")
    assert status(port, "sk-alpha") == 503 and service.process.poll() is None


@pytest.mark.parametrize("text, problem", [
    ('tenants: [{name: a, keys: ["sk-hidden"]', "not valid YAML"),
    ("tenants: []\n", "non-empty `tenants:` list"),
    ('tenants:\n  - keys: ["sk-hidden"]\n', "mapping with a name"),
    ('tenants:\n  - name: a\n', "has no keys"),
    ('tenants:\n  - name: a\n    keys: "sk-hidden"\n', "must be lists"),
    ('tenants:\n  - name: a\n    keys: ["sk-hidden"]\n  - name: b\n    keys: ["sk-hidden"]\n',
     "also one of 'a'"),
    (b'\xfftenants', "not UTF-8"),
    ('tenants:\n  - name: a\n    keys: ["sk-hidden"]\n    admin: "yes"\n',
     "admin must be true or false"),
])
def test_a_bad_file_is_refused_with_a_reason_that_quotes_no_key(text, problem):
    raw = text if isinstance(text, bytes) else text.encode()
    with pytest.raises(ValueError) as refused:
        parse_keys(raw, "keys.yaml")
    assert problem in str(refused.value) and "sk-hidden" not in str(refused.value)


def test_admin_is_off_unless_the_file_says_so():
    tenants = parse_keys(b'tenants:\n  - {name: a, keys: ["sk-a"]}\n'
                         b'  - {name: ops, keys: ["sk-ops"], admin: true}\n', "keys.yaml")
    assert sorted((t.name, t.admin) for t in tenants.values()) == [("a", False), ("ops", True)]
