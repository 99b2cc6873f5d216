"""API keys and tenants. Keys are read from a file (a mounted Kubernetes Secret) and kept only as
SHA-256 digests; each maps to a tenant with its priority, prefix-cache salt and rate limits.

File format (YAML or JSON):

    tenants:
      - name: acme
        keys: ["sk-acme-1"]          # or key_sha256: ["<hex digest>"]
        priority: 0                  # higher is served first; negative is sheddable
        cache_salt: acme-2026        # default: derived from the name
        requests_per_minute: 600     # optional
        tokens_per_minute: 200000    # optional; prompt plus max_tokens
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class Tenant:
    name: str
    priority: int = 0
    cache_salt: str | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


class AuthError(Exception):
    """Missing or unknown key: HTTP 401."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


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
                            tokens_per_minute=entry.get("tokens_per_minute"))
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
