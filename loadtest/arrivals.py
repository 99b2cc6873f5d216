"""When requests are sent: open-loop arrival times (Poisson, gamma with a burstiness factor, a
trace's own clock).

Open-loop arrivals do not wait for answers, so a slow server faces the same offered load as a fast
one and its queueing shows up as latency; closed-loop load (a fixed number of users, each sending
when its last answer came) is the runner's other mode and needs no schedule.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def gamma_arrivals(rate: float, duration_s: float, burstiness: float = 1.0,
                   seed: int = 0) -> list[float]:
    """Send times in [0, duration_s) with mean rate `rate`/s. Gaps are gamma(shape=burstiness,
    mean=1/rate), as in vLLM's benchmark: burstiness 1 is Poisson, below 1 burstier (gap CV =
    1/sqrt(burstiness)), above 1 smoother."""
    if rate <= 0 or duration_s <= 0 or burstiness <= 0:
        raise ValueError("rate, duration and burstiness must be positive")
    rng = np.random.default_rng(seed)
    # Draw gaps in batches until past the end; the mean count is rate*duration, so two batches
    # nearly always do.
    batch = max(16, int(rate * duration_s * 1.5) + 16)
    times: list[float] = []
    t = 0.0
    while True:
        for gap in rng.gamma(burstiness, 1.0 / (rate * burstiness), size=batch):
            t += float(gap)
            if t >= duration_s:
                return times
            times.append(t)


def poisson_arrivals(rate: float, duration_s: float, seed: int = 0) -> list[float]:
    return gamma_arrivals(rate, duration_s, 1.0, seed)


def rescaled_trace_arrivals(trace_s: Sequence[float], rate: float | None,
                            duration_s: float) -> list[float]:
    """A trace's arrival times from its first request, stretched or squeezed so their mean rate is
    `rate` (None: the trace's own clock), cut at duration_s. The shape (bursts, lulls) is the
    trace's; only the scale is stated."""
    if not trace_s:
        return []
    start = trace_s[0]
    offsets = [t - start for t in trace_s]
    factor = 1.0
    if rate is not None and len(offsets) > 1 and offsets[-1] > 0:
        factor = (len(offsets) - 1) / offsets[-1] / rate  # trace seconds -> load-test seconds
    return [o * factor for o in offsets if o * factor < duration_s]


def trace_time_factor(trace_s: Sequence[float], rate: float | None) -> float:
    """How many times faster than the trace the replay runs (for reports): 1 when it keeps the
    trace's clock."""
    if rate is None or len(trace_s) < 2 or trace_s[-1] <= trace_s[0]:
        return 1.0
    return rate / ((len(trace_s) - 1) / (trace_s[-1] - trace_s[0]))
