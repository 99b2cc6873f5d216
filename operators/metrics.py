"""The operator's own Prometheus metrics: every autoscaler decision, what it wants for each pool,
and the GPUs each pool holds."""
from __future__ import annotations

from prometheus_client import Counter, Gauge

DECISIONS = Counter("baton_autoscaler_decisions_total", "Autoscaler evaluations by outcome",
                    ["pool", "direction", "reason"])
DESIRED = Gauge("baton_autoscaler_desired_replicas", "Replicas the autoscaler last asked for",
                ["pool"])
POOL_GPUS = Gauge("baton_autoscaler_pool_gpus",
                  "GPUs a pool's replicas hold: replicas x GPUs per replica (its tensor-parallel "
                  "group)", ["pool"])
GPU_SECONDS = Counter("baton_autoscaler_gpu_seconds",
                      "GPU-seconds held by a pool's replicas, the denominator of goodput per GPU",
                      ["pool"])
