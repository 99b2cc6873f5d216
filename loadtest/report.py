"""How a load test's results are shown: a table for people, JSON for tools, PNG plots for the
docs."""
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
    rows = [(
        "requests (completed/refused/failed)",
        f"{summary['requests']} ({summary['completed']}/{summary['refused']}/{summary['failed']})"),
            ("duration (s)", _fmt(summary["duration_s"])),
            ("throughput (req/s, out tok/s)",
             f"{_fmt(summary['request_throughput_rps'])}, {_fmt(summary['output_throughput_tps'])}")
            ]
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms",
                                                                                    "E2E")):
        s = summary[key]
        rows.append((f"{name} ms (mean p50 p90 p99)",
                     " ".join(_fmt(s[k]) for k in ("mean", "p50", "p90", "p99"))))
    if summary.get("prefix_hit_ratio") is not None:
        bound = summary.get("prefix_reuse_bound")
        rows.append(
            ("prefix cache hits (share of prompt tokens)", f"{summary['prefix_hit_ratio']:.1%}" +
             (f" (unlimited-cache bound {bound:.1%})" if bound is not None else "")))
    slo = summary["slo"]
    if summary["slo_attainment"] is not None:
        rows.append(
            (f"SLO attainment (TTFT<={_fmt(slo['ttft_ms'])}ms TPOT<={_fmt(slo['tpot_ms'])}ms)",
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
        lines.append(
            f"{p['rate']:<6g} {s['completed']:>4}/{s['refused']}/{s['failed']:<6} "
            f"{_fmt(s['ttft_ms']['p90']):>8}  {_fmt(s['tpot_ms']['p90']):>8}  "
            f"{_fmt(s['itl_ms']['p99']):>7}  {_fmt(s['slo_attainment']):>6}  "
            f"{_fmt(s['goodput_rps'])}"
        )
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
    """TTFT and ITL CDFs, and latency over time (TTFT and E2E by send time; refusals and failures
    marked)."""
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
        ax.scatter([r.start_s for r in bad], [0] * len(bad), marker="x", color="red",
                   label="refused/failed")
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
    """Goodput and throughput against offered rate: where they part is where the SLO starts to be
    missed."""
    plt, path = _pyplot(), Path(folder) / "goodput_vs_rate.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    rates = [p["rate"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(rates, [p["summary"]["request_throughput_rps"] for p in points], "o-",
            label="throughput")
    ax.plot(rates, [p["summary"]["goodput_rps"] or 0 for p in points], "s-",
            label="goodput (meets SLO)")
    ax.plot(rates, rates, ":", color="gray", label="offered")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("req/s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


COMPARED = (("goodput_rps", "goodput req/s", None), ("slo_attainment", "attainment", None),
            ("output_throughput_tps", "output tok/s", None), ("ttft_ms", "TTFT p90 ms", "p90"),
            ("tpot_ms", "TPOT p90 ms", "p90"), ("itl_ms", "ITL p99 ms", "p99"))


def _figure(point: dict, key: str, quantile: str | None) -> float | None:
    value = point["summary"][key]
    return value[quantile] if quantile else value


def comparison_table(runs: dict[str, dict]) -> str:
    """Sweeps of several systems over the same rates, one row per rate and system (Markdown)."""
    lines = [
        "| rate | system | done/refused/failed | " + " | ".join(name
                                                                for _, name, _ in COMPARED) + " |",
        "|---" * (3 + len(COMPARED)) + "|"
    ]
    rates = sorted({p["rate"] for data in runs.values() for p in data["points"]})
    for rate in rates:
        for label, data in runs.items():
            for p in (p for p in data["points"] if p["rate"] == rate):
                s = p["summary"]
                cells = [_fmt(_figure(p, key, q)) for key, _, q in COMPARED]
                lines.append(
                    f"| {rate:g} | {label} | {s['completed']}/{s['refused']}/{s['failed']} | " +
                    " | ".join(cells) + " |")
    best = ", ".join(f"{label} {_fmt(data.get('distserve_goodput_rps'))}"
                     for label, data in runs.items())
    lines.append(f"\nDistServe goodput (highest rate with >=90% attainment, req/s): {best}")
    return "\n".join(lines)


def plot_comparison(runs: dict[str, dict], folder: str) -> Path:
    """Goodput, TTFT p90 and ITL p99 against offered rate, one line per system."""
    plt, path = _pyplot(), Path(folder) / "comparison.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, name, q) in zip(axes, (COMPARED[0], COMPARED[3], COMPARED[5])):
        for label, data in runs.items():
            points = sorted(data["points"], key=lambda p: p["rate"])
            ax.plot([p["rate"] for p in points], [_figure(p, key, q) or 0 for p in points], "o-",
                    label=label)
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        if key != "goodput_rps":
            ax.set_yscale("log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
