"""Server-side latency from a Prometheus /metrics page: histogram buckets, their difference over a
run, and quantiles estimated as Prometheus' histogram_quantile() does, to check the client's figures
against the server's."""
from __future__ import annotations

import math
import re
import urllib.request

# (upper bound `le`, cumulative count), ascending, ending with +Inf
Buckets = list[tuple[float, float]]

_BUCKET = re.compile(r'^(?P<name>[a-zA-Z_:][\w:]*)_bucket\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)')
_LE = re.compile(r'le="([^"]+)"')


def parse_histogram(text: str, name: str) -> Buckets:
    """The buckets of histogram `name`, summed over its other labels (one series for the whole
    server)."""
    counts: dict[float, float] = {}
    for line in text.splitlines():
        m = _BUCKET.match(line)
        if m and m.group("name") == name and (le := _LE.search(m.group("labels"))):
            bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
            counts[bound] = counts.get(bound, 0.0) + float(m.group("value"))
    return sorted(counts.items())


def scrape_histogram(metrics_url: str, name: str, timeout_s: float = 10.0) -> Buckets:
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        return parse_histogram(response.read().decode(), name)


def diff(after: Buckets, before: Buckets) -> Buckets:
    """What was observed between two scrapes of the same histogram (before may be empty: nothing
    yet)."""
    earlier = dict(before)
    return [(le, count - earlier.get(le, 0.0)) for le, count in after]


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' estimate: find the bucket holding rank q*count and interpolate linearly inside it
    (the first bucket's lower bound is 0; a rank in the +Inf bucket gives the highest finite bound).
    None when empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def bucket_of(value: float, buckets: Buckets) -> tuple[float, float]:
    """(lower, upper] bounds of the bucket a value falls in: the resolution a server-side quantile
    has there."""
    lower = 0.0
    for le, _ in buckets:
        if value <= le:
            return lower, le
        lower = le
    return lower, math.inf
