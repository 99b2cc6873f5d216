"""LoRA adapters loaded at runtime (the gateway's /v1/load_lora_adapter) as the fleet's desired
state, as AIBrix's adapter controller keeps it: per base model, each adapter's name and folder. A
worker that lacks one (it registered, restarted or was discovered after the load) is told to load
it by its feed (services/router/worker_feeds.py), and until it has it no request for that adapter
is placed there, so a request never lands on a worker that would answer 404.

Whether a worker has an adapter: its last report says so, unless this router confirmed the adapter
there (the gateway's fan-out, or the feed's own load) after that report was taken; a report taken
later rules again, so a worker that restarts without it is seen to lack it at its next report.
Adapters given at start (--lora-modules) are the workers' own and are not tracked here.

The set lives in memory: a restarted router starts empty, and the gateways, which record every
runtime load, re-assert it (services/gateway/lora_reconcile.py) once GetStats shows it lacking."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from baton.services.router.config import RouterConfig
from baton.services.router.worker_state import WorkerState

# After a failed load (the folder is not on that worker's volume, say), when to try it again there.
RETRY_FAILED_S = 30.0


@dataclass(frozen=True)
class LoRALoad:
    name: str
    path: str


class RuntimeLoRAs:
    """Part of the router facade (services/router/router.py), under its lock: the gateway's
    SetRuntimeLoRA calls `set`, each worker feed `to_load` and `loaded`, and placement `serves`
    (already under the lock)."""

    def __init__(self, lock: threading.RLock, workers: dict[str, WorkerState],
                 config: RouterConfig, clock: Callable[[], float],
                 on_change: Callable[[], None]) -> None:
        self._lock, self._workers, self._config = lock, workers, config
        self._clock, self._on_change = clock, on_change
        self._wanted: dict[str, dict[str, str]] = {}  # model -> adapter name -> folder
        self._failed: dict[tuple[str, str], float] = {}  # (worker id, name) -> when

    def set(self, model: str | None, name: str, path: str | None,
            worker_ids: Iterable[str] = ()) -> None:
        """A runtime load (path) or unload (None) of a base model's adapter; `worker_ids`: the
        workers that serve it already. Idempotent: gateways repeat it whenever the router may
        have forgotten it. KeyError for a model the router does not route, ValueError without a
        name."""
        model = model or self._config.model
        if model not in self._config.served_models():
            raise KeyError(f"model {model!r} is not served here")
        if not name:
            raise ValueError("lora_name is required")
        with self._lock:
            adapters = self._wanted.setdefault(model, {})
            if path is None:
                adapters.pop(name, None)
                return
            adapters[name] = path
            for worker_id in worker_ids:
                if worker_id in self._workers:
                    confirm(self._workers[worker_id], name, self._clock())
            self._on_change()

    def wanted(self, model: str) -> tuple[tuple[str, str], ...]:
        """The model's runtime adapters as (name, folder) pairs, by name (GetStats: a gateway
        re-asserts what a restarted router lacks)."""
        with self._lock:
            return tuple(sorted(self._wanted.get(model, {}).items()))

    def to_load(self, worker_id: str) -> list[LoRALoad]:
        """The runtime adapters the worker lacks (none before its first report), less those whose
        load failed there within RETRY_FAILED_S."""
        with self._lock:
            worker, now = self._workers.get(worker_id), self._clock()
            if worker is None or worker.report is None:
                return []
            return [LoRALoad(name, path)
                    for name, path in self._wanted.get(worker.model, {}).items()
                    if not has(worker, name)
                    and now - self._failed.get((worker_id, name), -RETRY_FAILED_S)
                    >= RETRY_FAILED_S]

    def loaded(self, worker_id: str, load: LoRALoad, ok: bool) -> None:
        """What a feed's load came to (ok: the worker serves the adapter now, or had it)."""
        with self._lock:
            worker, now = self._workers.get(worker_id), self._clock()
            if worker is None:
                return
            if not ok:
                self._failed[(worker_id, load.name)] = now
                return
            self._failed.pop((worker_id, load.name), None)
            if self._wanted.get(worker.model, {}).get(load.name) == load.path:
                confirm(worker, load.name, now)
                self._on_change()

    def serves(self, worker: WorkerState, name: str | None) -> bool:
        """Whether a request for `name` may go to this worker: any worker for the base model or an
        adapter not loaded at runtime, only those that have it for a runtime one."""
        if name is None or name not in self._wanted.get(worker.model, {}):
            return True
        return has(worker, name)

    def forget(self, worker_id: str) -> None:
        for key in [k for k in self._failed if k[0] == worker_id]:
            del self._failed[key]


def confirm(worker: WorkerState, name: str, now: float) -> None:
    worker.lora_confirmed[name] = now


def has(worker: WorkerState, name: str) -> bool:
    """The worker's last report, or this router's confirmation when it came after the report."""
    confirmed = worker.lora_confirmed.get(name)
    report = worker.report
    if report is not None and (confirmed is None or report.timestamp_s > confirmed):
        worker.lora_confirmed.pop(name, None)
        return name in report.lora_adapters
    return confirmed is not None
