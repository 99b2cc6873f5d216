"""How a load test's results are shown: a table for people, JSON for tools, PNG plots for the docs."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from baton.loadtest.stats import OK, RequestResult


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def table(summary: dict, title: str = "") -> str:
    """The summary of one run as an aligned text table."""
    rows = [("requests (completed/refused/failed)",
             f"{summary['requests']} ({summary['completed']}/{summary['refused']}/{summary['failed']})"),
            ("duration (s)", _fmt(summary["duration_s"])),
            ("throughput (req/s, out tok/s)",
             f"{_fmt(summary['request_throughput_rps'])}, {_fmt(summary['output_throughput_tps'])}")]
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        s = summary[key]
        rows.append((f"{name} ms (mean p50 p90 p99)", " ".join(_fmt(s[k]) for k in ("mean", "p50", "p90", "p99"))))
    if summary.get("prefix_hit_ratio") is not None:
        rows.append(("prefix cache hits (share of prompt tokens)", f"{summary['prefix_hit_ratio']:.1%}"))
    slo = summary["slo"]
    if summary["slo_attainment"] is not None:
        rows.append((f"SLO attainment (TTFT<={_fmt(slo['ttft_ms'])}ms TPOT<={_fmt(slo['tpot_ms'])}ms)",
                     f"{summary['slo_attainment']:.1%}"))
        rows.append(("goodput (req/s meeting SLO)", _fmt(summary["goodput_rps"])))
    width = max(len(k) for k, _ in rows)
    lines = [title] if title else []
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"error: {e}" for e in summary["errors"][:3]]
    return "\n".join(lines)


def sweep_table(points: Sequence[dict], distserve: float | None) -> str:
    lines = ["rate   done/ref/fail  TTFT p90  TPOT p90  ITL p99  attain  goodput"]
    for p in points:
        s = p["summary"]
        lines.append(f"{p['rate']:<6g} {s['completed']:>4}/{s['refused']}/{s['failed']:<6} "
                     f"{_fmt(s['ttft_ms']['p90']):>8}  {_fmt(s['tpot_ms']['p90']):>8}  "
                     f"{_fmt(s['itl_ms']['p99']):>7}  {_fmt(s['slo_attainment']):>6}  {_fmt(s['goodput_rps'])}")
    lines.append(f"DistServe goodput (highest rate with >=90% attainment): {_fmt(distserve)} req/s")
    return "\n".join(lines)


def write_json(path: str, data: dict) -> None:
    text = json.dumps(data, indent=2)
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: load tests run on headless machines
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, values_ms: Sequence[float], label: str, xlabel: str) -> None:
    if len(values_ms):
        xs = np.sort(values_ms)
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of samples")
    ax.grid(alpha=0.3)


def plot_run(results: Sequence[RequestResult], folder: str, label: str = "run") -> list[Path]:
    """TTFT and ITL CDFs, and latency over time (TTFT and E2E by send time; refusals and failures marked)."""
    plt, out = _pyplot(), Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in results if r.status == OK]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    _cdf(axes[0], [r.ttft_s * 1000 for r in ok], label, "TTFT (ms)")
    _cdf(axes[1], [g * 1000 for r in ok for g in r.itls_s], label, "inter-token latency (ms)")
    axes[1].set_xscale("log")
    fig.tight_layout()
    paths = [out / "latency_cdf.png"]
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.scatter([r.start_s for r in ok], [r.ttft_s * 1000 for r in ok], s=6, label="TTFT")
    ax.scatter([r.start_s for r in ok], [r.e2e_s * 1000 for r in ok], s=6, label="E2E")
    bad = [r for r in results if r.status != OK]
    if bad:
        ax.scatter([r.start_s for r in bad], [0] * len(bad), marker="x", color="red", label="refused/failed")
    ax.set_xlabel("send time (s)")
    ax.set_ylabel("latency (ms)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "latency_over_time.png")
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    return paths


def plot_sweep(points: Sequence[dict], folder: str) -> Path:
    """Goodput and throughput against offered rate: where they part is where the SLO starts to be missed."""
    plt, path = _pyplot(), Path(folder) / "goodput_vs_rate.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    rates = [p["rate"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(rates, [p["summary"]["request_throughput_rps"] for p in points], "o-", label="throughput")
    ax.plot(rates, [p["summary"]["goodput_rps"] or 0 for p in points], "s-", label="goodput (meets SLO)")
    ax.plot(rates, rates, ":", color="gray", label="offered")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("req/s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
