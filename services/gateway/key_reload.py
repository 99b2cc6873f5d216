"""Keeps the gateway's API keys in step with their file, so a key removed from it stops working
without a restart.

Kubernetes updates a mounted Secret by swapping a symlinked directory: the path stays, what it
resolves to changes, and no inotify event need fire on the path itself. So the file's content is
polled (its SHA-256, every `api_keys_poll_interval_s`), and SIGHUP reloads at once. A file that
cannot be read or parsed leaves the keys in force as they were: one error per bad version, counted
in `baton_gateway_api_key_reloads_total{result="error"}`."""
from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

from prometheus_client import Counter

from baton.services.gateway.tenants import KeyStore, parse_keys

log = logging.getLogger(__name__)


class KeyReloader:
    def __init__(self, keys: KeyStore, path: Path, interval_s: float, reloads: Counter) -> None:
        self.keys, self.path, self.interval_s = keys, path, interval_s
        self.reloads = reloads
        # The last version tried, good or bad: an unchanged file is not parsed (or logged) again.
        self._seen = keys.version

    def check(self, cause: str = "file changed", force: bool = False) -> None:
        """Reloads if the file changed since the last check (or always, with `force`)."""
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            version, problem = f"unreadable: {e.strerror}", f"cannot read it: {e.strerror}"
        else:
            version, problem = hashlib.sha256(raw).hexdigest(), None
        if version == self._seen and not force:
            return
        self._seen = version
        try:
            if problem is not None:
                raise ValueError(problem)
            by_digest = parse_keys(raw, str(self.path))
        except ValueError as e:
            self.reloads.labels("error").inc()
            log.error("API keys not reloaded (%s); the previous keys stay in force: %s", cause, e)
            return
        self.keys.replace(by_digest, version)
        self.reloads.labels("ok").inc()
        tenants, keys = self.keys.counts()
        log.info("API keys reloaded from %s (%s): %d tenants, %d keys", self.path, cause,
                    tenants, keys)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.check()
