"""The operator's own Prometheus metrics: every autoscaler decision, and what it wants for each
pool."""
from __future__ import annotations

from prometheus_client import Counter, Gauge

DECISIONS = Counter("baton_autoscaler_decisions_total", "Autoscaler evaluations by outcome",
                    ["pool", "direction", "reason"])
DESIRED = Gauge("baton_autoscaler_desired_replicas", "Replicas the autoscaler last asked for",
                ["pool"])
