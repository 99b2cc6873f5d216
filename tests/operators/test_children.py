"""The router's flags and the gateway's pod and Service as the operator renders them from a
BatonDeployment."""
from __future__ import annotations

from baton.operators import resources as r
import pytest

from baton.operators.children import gateway_objects, router_args, worker_pools
from baton.operators.settings import OperatorSettings
from baton.operators.state_store import STATE_DIR
from baton.operators.spec import defaulted


def test_router_cuts_prompts_into_the_smallest_worker_block_size_compared_as_numbers():
    body = {"metadata": {"name": "qwen", "namespace": "llm"}}
    # engineArgs values are strings in the CRD: as strings "16" < "8", as block sizes 8 is the
    # smaller.
    spec = {
        "router": {"port": 50051, "policy": "prefix-aware"}, "model": {}, "pools": {
            "prefill": {"engineArgs": {"block-size": "16"}},
            "decode": {"engineArgs": {"block-size": "8"}}
        }
    }
    args = router_args(body, spec, OperatorSettings())
    assert args[args.index("--block-size") + 1] == "8"


def test_least_loaded_is_the_default_scorers_with_the_prefix_scorer_off():
    import argparse

    from baton.services.common.settings import add_settings_arguments, settings_from_args
    from baton.services.router.config import RouterConfig
    body = {"metadata": {"name": "qwen", "namespace": "llm"}}
    spec = {"router": {"port": 50051, "policy": "least-loaded"}, "model": {}, "pools": {}}
    args = router_args(body, spec, OperatorSettings())
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, RouterConfig)
    scorers = args[args.index("--scorers"):args.index("--scorers") + 2]
    config = settings_from_args(RouterConfig, parser.parse_args(scorers))
    # the scorers that favour a worker for its cache (prefixes, affinity keys) weigh nothing
    expected = {e.name: (0.0 if e.name in ("prefix_overlap", "affinity_key") else e.weight)
                for e in RouterConfig().scorers}
    assert {e.name: e.weight for e in config.scorers} == expected


def test_gateway_metrics_are_on_a_pod_port_the_service_leaves_out():
    body = {"metadata": {"name": "qwen", "namespace": "llm", "uid": "u"},
            "apiVersion": r.API_VERSION, "kind": r.DEPLOYMENT_KIND,
            "spec": {"model": {"huggingFace": "Qwen/Qwen3-8B"}, "image": {"worker": "w:1"},
                     "gateway": {"serviceType": "LoadBalancer"},
                     "pools": {"decode": {"minReplicas": 1, "maxReplicas": 1}}}}
    settings = OperatorSettings(probe_port=9100)
    objects = gateway_objects(body, defaulted(r.DEPLOYMENT_KIND, body), settings)
    deployment, service = (next(o for o in objects if o["kind"] == kind)
                           for kind in ("Deployment", "Service"))
    box = deployment["spec"]["template"]["spec"]["containers"][0]
    assert box["args"][box["args"].index("--metrics-port") + 1] == "9100"
    assert {p["name"]: p["containerPort"] for p in box["ports"]} == {"http": 8000, "metrics": 9100}
    assert box["readinessProbe"]["httpGet"]["port"] == "http"
    assert service["spec"]["type"] == "LoadBalancer"
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]


def test_the_stores_urls_come_from_their_secrets_never_from_flags():
    body = {"metadata": {"name": "qwen", "namespace": "llm", "uid": "u"},
            "apiVersion": r.API_VERSION, "kind": r.DEPLOYMENT_KIND,
            "spec": {"model": {"huggingFace": "Qwen/Qwen3-8B"}, "image": {"worker": "w:1"},
                     "gateway": {"replicas": 3, "rateLimitFail": "closed",
                                 "rateLimitStoreSecretRef": {"name": "redis"},
                                 "stateStoreSecretRef": {"name": "pg", "key": "dsn"}},
                     "pools": {"decode": {"minReplicas": 1, "maxReplicas": 1}}}}
    objects = gateway_objects(body, defaulted(r.DEPLOYMENT_KIND, body), OperatorSettings())
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3
    box = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("valueFrom") for e in box["env"]}
    assert env["BATON_RATE_LIMIT_STORE"] == {"secretKeyRef": {"name": "redis", "key": "url"}}
    assert env["BATON_STATE_STORE"] == {"secretKeyRef": {"name": "pg", "key": "dsn"}}
    assert box["args"][box["args"].index("--rate-limit-fail") + 1] == "closed"
    assert not any("redis" in a or "--state-store" in a or "--rate-limit-store" in a
                   for a in box["args"])


def gateway_pod(gateway: dict) -> tuple[dict, dict]:
    """The gateway's Deployment spec and container for a BatonDeployment with this gateway."""
    body = {"metadata": {"name": "qwen", "namespace": "llm", "uid": "u"},
            "apiVersion": r.API_VERSION, "kind": r.DEPLOYMENT_KIND,
            "spec": {"model": {"huggingFace": "Qwen/Qwen3-8B"}, "image": {"worker": "w:1"},
                     "gateway": gateway, "pools": {"decode": {"minReplicas": 1,
                                                              "maxReplicas": 1}}}}
    objects = gateway_objects(body, defaulted(r.DEPLOYMENT_KIND, body), OperatorSettings())
    deployment = next(o for o in objects if o["kind"] == "Deployment")["spec"]
    return deployment, deployment["template"]["spec"]["containers"][0]


def mounted_volume(deployment: dict, box: dict, path: str) -> dict:
    """The pod's volume the container mounts at `path` (its `name` left out)."""
    name = next(m["name"] for m in box["volumeMounts"] if m["mountPath"] == path)
    volume = next(v for v in deployment["template"]["spec"]["volumes"] if v["name"] == name)
    return {k: v for k, v in volume.items() if k != "name"}


def test_one_gateway_keeps_its_state_in_sqlite_on_an_empty_dir_by_default():
    deployment, box = gateway_pod({})
    assert f"--state-store=sqlite:///{STATE_DIR}/state.db" in box["args"]
    assert mounted_volume(deployment, box, STATE_DIR) == {"emptyDir": {"sizeLimit": "1Gi"}}
    assert "strategy" not in deployment  # a new pod starts on a store of its own


def test_a_claimed_state_volume_outlives_the_pod_which_is_replaced_by_recreate():
    deployment, box = gateway_pod({"stateStoreVolume": {"claimName": "gw-state"}})
    assert f"--state-store=sqlite:///{STATE_DIR}/state.db" in box["args"]
    assert mounted_volume(deployment, box, STATE_DIR) == {
        "persistentVolumeClaim": {"claimName": "gw-state"}}
    # a ReadWriteOnce claim (and the SQLite file on it) takes one pod at a time
    assert deployment["strategy"] == {"type": "Recreate"}


def test_a_postgresql_state_store_needs_no_volume():
    deployment, box = gateway_pod({"stateStoreSecretRef": {"name": "pg"}})
    assert not any(a.startswith("--state-store") for a in box["args"])
    assert all(m["mountPath"] != STATE_DIR for m in box["volumeMounts"])
    assert "strategy" not in deployment


def test_without_stores_the_gateway_gets_neither_variable():
    body = {"metadata": {"name": "qwen", "namespace": "llm", "uid": "u"},
            "apiVersion": r.API_VERSION, "kind": r.DEPLOYMENT_KIND,
            "spec": {"model": {"huggingFace": "Qwen/Qwen3-8B"}, "image": {"worker": "w:1"},
                     "pools": {"decode": {"minReplicas": 1, "maxReplicas": 1}}}}
    objects = gateway_objects(body, defaulted(r.DEPLOYMENT_KIND, body), OperatorSettings())
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    box = deployment["spec"]["template"]["spec"]["containers"][0]
    assert deployment["spec"]["replicas"] == 1
    assert not {e["name"] for e in box["env"]} & {"BATON_RATE_LIMIT_STORE", "BATON_STATE_STORE"}


@pytest.mark.parametrize("prefill,decode,layout", [
    ({"tensorParallelSize": 4}, {"tensorParallelSize": 8}, ["HND", "HND"]),
    ({"tensorParallelSize": 8}, {"tensorParallelSize": 8}, [None, None]),  # whole blocks
    ({"tensorParallelSize": 4, "engineArgs": {"kv-cache-layout": "NHD"}},
     {"tensorParallelSize": 8}, ["NHD", None]),  # a layout given is the user's choice
])
def test_pools_of_different_tp_sizes_get_head_major_blocks(prefill, decode, layout):
    body = {"metadata": {"name": "llama", "namespace": "llm", "uid": "u"},
            "apiVersion": r.API_VERSION, "kind": r.DEPLOYMENT_KIND,
            "spec": {"model": {"huggingFace": "meta-llama/Llama-3.1-70B"},
                     "image": {"worker": "w:1"},
                     "pools": {"prefill": {"minReplicas": 1, "maxReplicas": 2, **prefill},
                               "decode": {"minReplicas": 1, "maxReplicas": 2, **decode}}}}
    pools = worker_pools(body, defaulted(r.DEPLOYMENT_KIND, body), OperatorSettings())
    assert [p["spec"]["role"] for p in pools] == ["prefill", "decode"]
    assert [p["spec"].get("engineArgs", {}).get("kv-cache-layout") for p in pools] == layout
