"""The gateway's part of a BatonDeployment's schema: its Service, keys, stores, and the rules that
keep more than one replica from granting every tenant its limits again or keeping stored
responses apart."""
from __future__ import annotations

from baton.operators.schema_builders import (QUANTITY, Schema, obj, rule, service_component,
                                             string)


def secret_url(what: str, flag: str, variable: str) -> Schema:
    return obj({"name": string("Secret name", minLength=1),
                "key": string("Key holding the URL", default="url")}, required=["name"],
               description=f"Secret holding the URL of the gateway's {what} ({flag}, given as "
                           f"{variable} from the Secret, so a password in it stays out of the "
                           "pod spec)")


def gateway_rules() -> list[dict[str, str]]:
    """Each replica keeps its own buckets unless they share a store: N replicas would grant every
    tenant N times its limits."""
    return [rule("self.replicas <= 1 || has(self.rateLimitStoreSecretRef)",
                 "more than one gateway replica needs a shared rate-limit store "
                 "(gateway.rateLimitStoreSecretRef): each replica would grant every tenant its "
                 "limits again"),
            rule("self.replicas <= 1 || has(self.stateStoreSecretRef)",
                 "more than one gateway replica needs a shared state store "
                 "(gateway.stateStoreSecretRef, PostgreSQL): each replica would keep its own "
                 "stored responses and usage records"),
            rule("!has(self.stateStoreSecretRef) || !has(self.stateStoreVolume)",
                 "gateway.stateStoreSecretRef and gateway.stateStoreVolume are two state stores: "
                 "set one")]


def state_store_volume() -> Schema:
    return obj({
        "claimName": string("PersistentVolumeClaim holding the SQLite file, kept across restarts "
                            "(the gateway's Deployment then replaces its pod by Recreate); unset: "
                            "an emptyDir, lost with the pod", minLength=1),
        "sizeLimit": {**QUANTITY, "description": "The emptyDir's size limit",
                      "default": "1Gi"},
    }, description="The single replica's state store without stateStoreSecretRef: a SQLite file "
                   "(--state-store sqlite:////var/lib/baton/state/state.db) on this volume; "
                   "unset, an emptyDir of 1Gi")


def gateway() -> Schema:
    schema = service_component(
        "gateway", 8000, "HTTP (OpenAI API, probes; not /metrics)",
        serviceType=string("How the OpenAI endpoint is exposed",
                           enum=["ClusterIP", "NodePort", "LoadBalancer"], default="ClusterIP"),
        apiKeysSecretRef=obj(
            {
                "name": string("Secret name", minLength=1),
                "key": string("Key holding the tenants/keys YAML", default="keys.yaml")
            }, required=["name"],
            description="Secret with the gateway's tenants and API keys (--api-keys-file); "
                        "unset serves everyone as the default tenant (--no-auth)"),
        rateLimitStoreSecretRef=secret_url(
            "rate-limit store (redis://..., shared by the replicas; required for more than one)",
            "--rate-limit-store", "BATON_RATE_LIMIT_STORE"),
        rateLimitFail=string("While the rate-limit store is unreachable: open admits requests "
                             "unlimited, closed refuses them with 503 (--rate-limit-fail)",
                             enum=["open", "closed"], default="open"),
        stateStoreSecretRef=secret_url(
            "state store (postgresql://... for stored responses and usage records)",
            "--state-store", "BATON_STATE_STORE"),
        stateStoreVolume=state_store_volume(),
        allowRuntimeLoraUpdating={
            "type": "boolean", "default": False,
            "description": "Let admin keys load and unload LoRA adapters at runtime "
                           "(--allow-runtime-lora-updating: POST /v1/load_lora_adapter, "
                           "/v1/unload_lora_adapter); the workers need LoRA on and the adapters' "
                           "folders on a volume they all mount"})
    schema["x-kubernetes-validations"] = gateway_rules()
    return schema
