"""Reading a BatonDeployment or WorkerPool: defaulted spec, and every way it breaks its CRD's
rules."""
from __future__ import annotations

from typing import Any

import jsonschema

from baton.operators import crd_schema
from baton.operators import resources as r
from baton.operators.schema_checks import apply_defaults, rule_violations


def defaulted(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The object's spec with the CRD's defaults filled in, as the API server would have stored
    it."""
    schema = crd_schema.open_api_schema(kind)["properties"]["spec"]
    spec = dict(body.get("spec") or {})
    if kind == r.DEPLOYMENT_KIND and "gatewayRef" not in spec:
        # What the schema leaves undefaulted, so that its rule can tell a member that sets them.
        spec = {"gateway": {}, "router": {}, "slos": crd_schema.DEFAULT_SLOS, **spec}
    return apply_defaults(schema, spec)


def problems(kind: str, spec: dict[str, Any]) -> list[str]:
    """Schema errors first, then CEL-rule violations; empty when the (defaulted) spec is valid."""
    schema = crd_schema.open_api_schema(kind)["properties"]["spec"]
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(spec),
        key=lambda e: list(e.absolute_path))
    found = [f".spec{''.join(f'.{p}' for p in e.absolute_path)}: {e.message}" for e in errors]
    return found + rule_violations(schema, spec, ".spec")
