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
        admin: true                  # optional; may load and unload LoRA adapters at runtime

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

from baton.services.openai.errors import ProtocolError

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
    admin: bool = False  # its keys may change what is served (runtime LoRA updates)

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


def key_id(authorization: str | None) -> str | None:
    """A key's id in usage records: the first 12 hex digits of its SHA-256 (the key itself is
    never stored). None without a bearer key."""
    if not authorization or not authorization.lower().startswith("bearer "):
        return None
    return digest(authorization[7:].strip())[:12]


def _optional_int(entry: dict, key: str) -> int | None:
    value = entry.get(key)
    return None if value is None else int(value)


def _yaml_error(error: yaml.YAMLError) -> str:
    """Where the file is wrong, without the snippet PyYAML quotes, which may hold a key."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or type(error).__name__
    return f"line {mark.line + 1}: {problem}" if mark is not None else problem


def _tenant(entry: object, source: str) -> tuple[Tenant, list[str]]:
    if not isinstance(entry, dict) or not str(entry.get("name") or ""):
        raise ValueError(f"{source}: each tenant must be a mapping with a name")
    name = str(entry["name"])
    keys, hashed = entry.get("keys", []), entry.get("key_sha256", [])
    if not isinstance(keys, list) or not isinstance(hashed, list):
        raise ValueError(f"{source}: tenant {name!r}: keys and key_sha256 must be lists")
    try:
        priorities = {key: _optional_int(entry, key)
                      for key in ("priority", "min_priority", "max_priority")}
    except (TypeError, ValueError):
        raise ValueError(f"{source}: tenant {name!r}: priorities must be integers") from None
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{source}: tenant {name!r}: admin must be true or false")
    try:
        tenant = Tenant(name=name, admin=admin, priority=priorities["priority"] or 0,
                        cache_salt=str(entry.get("cache_salt") or f"tenant:{name}"),
                        requests_per_minute=entry.get("requests_per_minute"),
                        tokens_per_minute=entry.get("tokens_per_minute"),
                        min_priority=priorities["min_priority"],
                        max_priority=priorities["max_priority"])
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    digests = [digest(str(k)) for k in keys] + [str(h).lower() for h in hashed]
    if not digests:
        raise ValueError(f"{source}: tenant {name!r} has no keys")
    return tenant, digests


def parse_keys(raw: bytes, source: str) -> dict[str, Tenant]:
    """Tenants by key digest from the file's bytes. A ValueError says what is wrong with the file
    and never quotes a key."""
    try:
        doc = yaml.safe_load(raw.decode("utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ValueError(f"{source}: not UTF-8 (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: not valid YAML or JSON ({_yaml_error(e)})") from None
    entries = doc.get("tenants") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        # with auth on, a store without keys would turn every client away
        raise ValueError(f"{source}: expected a non-empty `tenants:` list")
    by_digest: dict[str, Tenant] = {}
    for entry in entries:
        tenant, digests = _tenant(entry, source)
        for d in digests:
            if d in by_digest and by_digest[d].name != tenant.name:
                raise ValueError(f"{source}: a key of tenant {tenant.name!r} is also one of "
                                 f"{by_digest[d].name!r}")
            by_digest[d] = tenant
    return by_digest


class KeyStore:
    """The keys in force. `replace` swaps them all at once (a reload), so a request sees either
    the old set or the new one."""

    def __init__(self, tenants_by_digest: dict[str, Tenant], version: str | None = None) -> None:
        self._by_digest = tenants_by_digest
        self.version = version  # SHA-256 of the file content the keys came from

    @classmethod
    def load(cls, path: str | Path) -> "KeyStore":
        raw = Path(path).read_bytes()
        return cls(parse_keys(raw, str(path)), hashlib.sha256(raw).hexdigest())

    def replace(self, tenants_by_digest: dict[str, Tenant], version: str) -> None:
        self._by_digest, self.version = tenants_by_digest, version

    def counts(self) -> tuple[int, int]:
        """(tenants, keys)."""
        by_digest = self._by_digest
        return len({t.name for t in by_digest.values()}), len(by_digest)

    def tenant_for(self, authorization: str | None) -> Tenant:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthError("missing API key: send it as `Authorization: Bearer <key>`")
        wanted = digest(authorization[7:].strip())
        for known, tenant in self._by_digest.items():
            if hmac.compare_digest(known, wanted):
                return tenant
        raise AuthError("incorrect API key provided")
