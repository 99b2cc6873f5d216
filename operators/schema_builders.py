"""The pieces the CRD schemas are built of: typed fields with descriptions, CEL rules, resource
quantities, and a service's replicas/port/resources."""
from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = required
    return schema


def integer(description: str, minimum: int | None = None, maximum: int | None = None,
            **extra: Any) -> Schema:
    schema: Schema = {"type": "integer", "description": description, **extra}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def string(description: str, **extra: Any) -> Schema:
    return {"type": "string", "description": description, **extra}


def rule(expression: str, message: str) -> dict[str, str]:
    return {"rule": expression, "message": message}


# The pattern is Kubernetes' own for resource.Quantity, as in the built-in CRDs' schemas.
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
QUANTITY: Schema = {
    "anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True,
    "pattern": QUANTITY_PATTERN
}
RESOURCES = obj(
    {
        "limits": {"type": "object", "additionalProperties": QUANTITY},
        "requests": {"type": "object", "additionalProperties": QUANTITY}
    }, description="CPU and memory requests and limits of each replica (GPUs come from `gpus`)")
def service_component(name: str, port: int, protocol: str, **more: Schema) -> Schema:
    return obj(
        {
            "replicas": integer(f"{name} replicas" + (
                " (more than one needs rateLimitStoreSecretRef and stateStoreSecretRef)"
                if name == "gateway" else ""), minimum=1, maximum=100, default=1),
            "port": integer(f"{name} {protocol} port", minimum=1024, maximum=65535, default=port),
            "resources": RESOURCES,
            **more,
        }, default={})
