"""LoRA adapters loaded at runtime (the gateway's /v1/load_lora_adapter) as the fleet's desired state,
as AIBrix's adapter controller keeps it: per base model, each adapter's name and folder. A worker
that lacks one (it registered, restarted or was discovered after the load) is told to load it by
its feed (services/router/worker_feeds.py), and until it has it no request for that adapter is
placed there, so a request never lands on a worker that would answer 404.

Whether a worker has an adapter: its last report says so, unless this router confirmed the adapter
there (the gateway's fan-out, or the feed's own load) after that report was taken; a report taken
later rules again, so a worker that restarts without it is seen to lack it at its next report.
Adapters given at start (--lora-modules) are the workers' own and are not tracked here."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from baton.services.router.worker_state import WorkerState

# After a failed load (the folder is not on that worker's volume, say), when to try it again there.
RETRY_FAILED_S = 30.0


@dataclass(frozen=True)
class LoRALoad:
    name: str
    path: str


class RuntimeLoRAs:
    """Not thread-safe: the router facade calls it under its lock."""

    def __init__(self) -> None:
        self._wanted: dict[str, dict[str, str]] = {}  # model -> adapter name -> folder
        self._failed: dict[tuple[str, str], float] = {}  # (worker id, name) -> when

    def set(self, model: str, name: str, path: str | None, have: Iterable[WorkerState],
            now: float) -> None:
        """A load (path) or an unload (None); `have`: the workers that serve it already."""
        adapters = self._wanted.setdefault(model, {})
        if path is None:
            adapters.pop(name, None)
            return
        adapters[name] = path
        for worker in have:
            confirm(worker, name, now)

    def adapters(self, model: str) -> dict[str, str]:
        return dict(self._wanted.get(model, {}))

    def serves(self, worker: WorkerState, name: str | None) -> bool:
        """Whether a request for `name` may go to this worker: any worker for the base model or an
        adapter not loaded at runtime, only those that have it for a runtime one."""
        if name is None or name not in self._wanted.get(worker.model, {}):
            return True
        return has(worker, name)

    def to_load(self, worker: WorkerState, now: float) -> list[LoRALoad]:
        """The runtime adapters the worker lacks (none before its first report), less those whose
        load failed there within RETRY_FAILED_S."""
        if worker.report is None:
            return []
        return [LoRALoad(name, path) for name, path in self._wanted.get(worker.model, {}).items()
                if not has(worker, name)
                and now - self._failed.get((worker.worker_id, name), -RETRY_FAILED_S)
                >= RETRY_FAILED_S]

    def loaded(self, worker: WorkerState, load: LoRALoad, now: float) -> None:
        """The worker took the adapter (or had it already)."""
        self._failed.pop((worker.worker_id, load.name), None)
        if self._wanted.get(worker.model, {}).get(load.name) == load.path:
            confirm(worker, load.name, now)

    def failed(self, worker_id: str, load: LoRALoad, now: float) -> None:
        self._failed[(worker_id, load.name)] = now

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
