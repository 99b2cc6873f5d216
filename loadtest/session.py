"""A load test from end to end: the schedule for the chosen arrivals, the run, the statistics, the
server's own histograms when asked, and the report (table on stdout, plots). `baton loadtest` is a
thin shell around this."""
from __future__ import annotations

import argparse
import dataclasses
import itertools
from dataclasses import dataclass, field

from baton.loadtest import report
from baton.loadtest.arrivals import gamma_arrivals, rescaled_trace_arrivals, trace_time_factor
from baton.loadtest.prometheus import diff, histogram_quantile, scrape_histogram
from baton.loadtest.client import PromptOf, Target
from baton.loadtest.runner import RunResult, run_closed_loop, run_open_loop, schedule
from baton.loadtest.scenarios import WorkloadSpec, iter_requests
from baton.loadtest.stats import SLO, distserve_goodput, prefix_reuse_bound, summarize
from baton.loadtest.traces import TRACE_FILES

# Warm-up requests come from another seed's stream: the measured prompts must not be in the prefix
# cache already.
WARMUP_SEED_OFFSET = 7919
# Each sweep point draws its own prompts (seed + point * stride): repeating the last point's prompts
# would turn them into prefix-cache hits on servers that have a cache and not on those that don't.
POINT_SEED_STRIDE = 104729
WARMUP_CONCURRENCY = 4
SERVER_HISTOGRAMS = {"ttft_ms": "baton_gateway_time_to_first_token_seconds",
                     "itl_ms": "baton_gateway_inter_token_latency_seconds"}


@dataclass
class LoadTest:
    target: Target
    spec: WorkloadSpec
    duration_s: float
    drain_timeout_s: float = 60.0
    rate: float | None = None
    concurrency: int | None = None
    arrivals: str = "poisson"
    burstiness: float = 1.0
    slo: SLO = field(default_factory=SLO)
    plots: str | None = None
    server_metrics: str | None = None
    show_progress: bool = True
    warmup: int = 0
    block_size: int = 16  # the server's KV block size, for the reuse bound
    _trace_rows_used: int = field(default=0, init=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace, spec: WorkloadSpec,
                  prompt_of: PromptOf) -> LoadTest:
        arrivals = args.arrivals or ("trace" if spec.name in TRACE_FILES else "poisson")
        if arrivals == "trace" and spec.name not in TRACE_FILES:
            raise SystemExit("--arrivals trace needs a trace workload")
        target = Target(args.url, args.model, args.api_key, prompt_of, args.ignore_eos)
        return cls(target, spec, args.duration, args.drain_timeout, args.rate,
                   args.concurrency, arrivals, args.burstiness,
                   SLO(args.slo_ttft_ms, args.slo_tpot_ms), args.plots, args.server_metrics,
                   show_progress=not args.no_progress, warmup=args.warmup,
                   block_size=args.block_size)

    def _schedule(self, rate: float, point: int) -> tuple[list, dict]:
        if self.arrivals != "trace":
            seed = self.spec.seed + point * POINT_SEED_STRIDE
            requests = iter_requests(dataclasses.replace(self.spec, seed=seed))
            burstiness = self.burstiness if self.arrivals == "gamma" else 1.0
            times = gamma_arrivals(rate, self.duration_s, burstiness, seed)
            return schedule(times, requests), {"arrivals": self.arrivals, "burstiness": burstiness}
        # Enough trace rows to cover the run at this rate, with room for the trace's own bursts; a
        # sweep's later points go on where the earlier ones stopped.
        wanted = int(rate * self.duration_s * 2) + 16
        rows = list(
            itertools.islice(iter_requests(self.spec), self._trace_rows_used,
                             self._trace_rows_used + wanted))
        trace_s = [r.trace_s for r in rows]
        times = rescaled_trace_arrivals(trace_s, rate, self.duration_s)
        # the rows this point sends; the rest open the next point
        self._trace_rows_used += len(times)
        return list(zip(times, rows)), {
            "arrivals": "trace", "trace_speedup": trace_time_factor(trace_s, rate),
            "length_scale": self.spec.length_scale
        }

    async def warm_up(self) -> None:
        """Sends `warmup` requests and drops their results. A fresh server's first requests pay
        one-time costs (allocator growth, each new prompt shape's first kernels, the first KV
        transfer's connection) that say nothing about its steady state."""
        if self.warmup <= 0:
            return
        # A trace's rows are the same whatever the seed, so traces warm up on synthetic requests.
        name = "synthetic" if self.spec.name in TRACE_FILES else self.spec.name
        spec = dataclasses.replace(self.spec, name=name, seed=self.spec.seed + WARMUP_SEED_OFFSET)
        requests = (dataclasses.replace(r, session=None)
                    for r in itertools.islice(iter_requests(spec), self.warmup))
        await run_closed_loop(self.target, requests, min(WARMUP_CONCURRENCY, self.warmup),
                              float("inf"), self.drain_timeout_s, show_progress=False)

    async def _run(self, rate: float | None, point: int = 0) -> dict:
        before = self._scrape()
        if rate is not None:
            plan, arrivals = self._schedule(rate, point)
            result = await run_open_loop(self.target, plan, self.duration_s, self.drain_timeout_s,
                                         self.show_progress)
        else:
            arrivals = {"arrivals": "closed-loop", "concurrency": self.concurrency}
            result = await run_closed_loop(self.target, iter_requests(self.spec),
                                           self.concurrency or 1, self.duration_s,
                                           self.drain_timeout_s, self.show_progress)
        # Over the answered requests only: a refused prompt never reached a cache, so it can neither
        # hit nor seed hits, and a server that refuses its cache misses must not seem to beat the
        # bound.
        summary = {
            **summarize(result.results, result.duration_s, self.slo), "prefix_reuse_bound":
                prefix_reuse_bound(result.answered_prompts, self.block_size)
        }
        if before is not None:
            summary["server"] = self._server_quantiles(before)
        return {
            "rate": rate, "workload": self.spec.name, **arrivals, "scheduled": result.scheduled,
            "summary": summary, "requests": [dataclasses.asdict(r) for r in result.results],
            "_result": result
        }

    def _scrape(self) -> dict | None:
        if not self.server_metrics:
            return None
        return {
            key: scrape_histogram(self.server_metrics, name)
            for key, name in SERVER_HISTOGRAMS.items()
        }

    def _server_quantiles(self, before: dict) -> dict:
        after = self._scrape() or {}
        out = {}
        for key, buckets in after.items():
            run = diff(buckets, before[key])
            out[key] = {
                f"p{round(q * 100)}": _ms(histogram_quantile(q, run))
                for q in (0.5, 0.9, 0.99)
            }
        return out

    async def single(self) -> dict:
        await self.warm_up()
        point = await self._run(self.rate)
        result: RunResult = point.pop("_result")
        load = (f"rate={self.rate:g}/s"
                if self.rate is not None else f"concurrency={self.concurrency}")
        print(
            report.table(point["summary"],
                         f"baton loadtest: {self.spec.name}, {load}, {self.arrivals}"))
        if "server" in point["summary"]:
            print(f"server histograms (ms): {point['summary']['server']}")
        if self.plots:
            point["plots"] = [
                str(p) for p in report.plot_run(result.results, self.plots, self.spec.name)
            ]
        return point

    async def sweep(self, rates: list[float]) -> dict:
        points = []
        await self.warm_up()
        for i, rate in enumerate(rates):
            point = await self._run(rate, i)
            point.pop("_result")
            points.append(point)
        best = distserve_goodput([(p["rate"], p["summary"]["slo_attainment"]) for p in points])
        print(report.sweep_table(points, best))
        data = {"workload": self.spec.name, "points": points, "distserve_goodput_rps": best}
        if self.plots:
            data["plots"] = [str(report.plot_sweep(points, self.plots))]
        return data


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
