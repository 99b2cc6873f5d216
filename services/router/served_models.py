"""What the router tells its gateways about each model it routes: the longest sequence every live
worker of the model accepts, and the LoRA adapters they serve (whose parent is that model). The
gateway's /v1/models is the union of these, and its length checks use each model's own limit."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from baton.services.common.messages.router import ModelStats
from baton.services.router.worker_state import WorkerState


def served_model_stats(names: Sequence[str],
                       live: Iterable[WorkerState]) -> tuple[ModelStats, ...]:
    """One entry per name, in order, from the live workers serving it (limit 0 and no adapters
    while none has reported)."""
    by_model: dict[str, list[WorkerState]] = {name: [] for name in names}
    for worker in live:
        if worker.model in by_model:
            by_model[worker.model].append(worker)
    served = []
    for name, workers in by_model.items():
        reports = [w.report for w in workers if w.report is not None]
        limits = [r.max_model_len for r in reports if r.max_model_len]
        adapters = tuple(sorted(set().union(*(r.lora_adapters for r in reports))))
        served.append(ModelStats(name, min(limits, default=0), adapters, len(workers)))
    return tuple(served)
