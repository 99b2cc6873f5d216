"""GPU-seconds each pool holds, the denominator of goodput per GPU: a replica holds all the GPUs of
its tensor-parallel group (operators/placement.py:gpus_per_replica), so a pool's GPUs are its
replicas times that, not its replicas."""
from __future__ import annotations

from baton.operators import metrics


class GpuSeconds:
    """Integrates each pool's GPU count between autoscaler evaluations into
    baton_autoscaler_gpu_seconds_total{pool}: the count seen at one evaluation is held until the
    next."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def observe(self, key: str, pool: str, gpus: int, now: float) -> float:
        """Records that `pool` (namespace/name `key`) holds `gpus` at `now`; returns the GPU-seconds
        added since its previous observation."""
        previous = self._last.get(key)
        self._last[key] = (now, gpus)
        metrics.POOL_GPUS.labels(pool=pool).set(gpus)
        if previous is None or now <= previous[0]:
            return 0.0
        added = (now - previous[0]) * previous[1]
        metrics.GPU_SECONDS.labels(pool=pool).inc(added)
        return added

    def forget(self, key: str) -> None:
        self._last.pop(key, None)
