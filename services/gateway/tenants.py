"""API keys and tenants. Keys are read from a file (a mounted Kubernetes Secret) and kept only as
SHA-256 digests; each maps to a tenant with its priority, prefix-cache salt and rate limits.

File format (YAML or JSON):

    tenants:
      - name: acme
        keys: ["sk-acme-1"]          # or key_sha256: ["<hex digest>"]
        priority: 0                  # higher is served first; negative is sheddable
        min_priority: -10            # optional; lowest a request's `priority` may take it to
        max_priority: 0              # optional; highest (default: `priority`)
        cache_salt: acme-2026        # default: derived from the name
        requests_per_minute: 600     # optional
        tokens_per_minute: 200000    # optional; prompt plus max_tokens

A request's own `priority` field (vLLM's meaning: lower is served earlier) moves its tenant's
priority, clamped to the band [min_priority, max_priority]: by default a client may lower its
requests' priority but not raise them above its tenant's, so the tiers set here hold. Priorities and
bounds lie within +-PRIORITY_BOUND.
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

import yaml

from baton.services.common.openai_protocol import ProtocolError

DEFAULT_TENANT = "default"
# Far inside the proto's int32, so a tenant's priority moved by any request's (at most
# --max-request-priority, itself at most a million) still fits.
PRIORITY_BOUND = 10**9


@dataclass(frozen=True)
class Tenant:
    name: str
    priority: int = 0
    cache_salt: str | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    min_priority: int | None = None  # None: no floor but the request field's range
    max_priority: int | None = None  # None: the tenant's own priority

    def __post_init__(self) -> None:
        low = self.min_priority if self.min_priority is not None else self.priority
        high = self.max_priority if self.max_priority is not None else self.priority
        if not -PRIORITY_BOUND <= low <= self.priority <= high <= PRIORITY_BOUND:
            raise ValueError(
                f"tenant {self.name!r}: need -{PRIORITY_BOUND} <= min_priority ({low}) <= priority "
                f"({self.priority}) <= max_priority ({high}) <= {PRIORITY_BOUND}")

    def priority_for(self, requested: int, limit: int) -> int:
        """The priority (higher first) a request's `priority` field (lower first) gives within this
        tenant's band; ProtocolError (400) when the field lies outside +-limit."""
        if not -limit <= requested <= limit:
            raise ProtocolError(
                f"priority must be between -{limit} and {limit} (lower is served earlier); got "
                f"{requested}", param="priority")
        ceiling = self.priority if self.max_priority is None else self.max_priority
        priority = min(self.priority - requested, ceiling)
        return priority if self.min_priority is None else max(priority, self.min_priority)


class AuthError(Exception):
    """Missing or unknown key: HTTP 401."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _optional_int(entry: dict, key: str) -> int | None:
    value = entry.get(key)
    return None if value is None else int(value)


class KeyStore:
    def __init__(self, tenants_by_digest: dict[str, Tenant]) -> None:
        self._by_digest = tenants_by_digest

    @classmethod
    def load(cls, path: str | Path) -> "KeyStore":
        doc = yaml.safe_load(Path(path).read_text()) or {}
        by_digest: dict[str, Tenant] = {}
        for entry in doc.get("tenants", []):
            tenant = Tenant(name=str(entry["name"]), priority=int(entry.get("priority", 0)),
                            cache_salt=str(entry.get("cache_salt") or f"tenant:{entry['name']}"),
                            requests_per_minute=entry.get("requests_per_minute"),
                            tokens_per_minute=entry.get("tokens_per_minute"),
                            min_priority=_optional_int(entry, "min_priority"),
                            max_priority=_optional_int(entry, "max_priority"))
            digests = [digest(k) for k in entry.get("keys", [])] + list(entry.get("key_sha256", []))
            if not digests:
                raise ValueError(f"tenant {tenant.name!r} in {path} has no keys")
            by_digest.update(dict.fromkeys(digests, tenant))
        return cls(by_digest)

    def tenant_for(self, authorization: str | None) -> Tenant:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthError("missing API key: send it as `Authorization: Bearer <key>`")
        wanted = digest(authorization[7:].strip())
        for known, tenant in self._by_digest.items():
            if hmac.compare_digest(known, wanted):
                return tenant
        raise AuthError("incorrect API key provided")
