"""The whole stack as real processes on loopback, started the way `baton serve` starts it."""
from __future__ import annotations

import argparse
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from baton.services.cli.serve import _start_stack
from baton.services.common.process import ServiceProcess, free_port


@dataclass
class Stack:
    services: list[ServiceProcess]  # in the order to stop them: gateway, router, workers
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def gateway(self) -> ServiceProcess:
        return self.services[0]

    @property
    def router(self) -> ServiceProcess:
        return self.services[1]

    def workers(self, role: str | None = None) -> list[ServiceProcess]:
        return [s for s in self.services[2:] if role is None or s.name.startswith(role)]

    def gateway_metric(self, name: str) -> float:
        return scrape(f"http://127.0.0.1:{self.port}/metrics", name)

    def stop(self) -> None:
        for service in self.services:
            service.terminate()


def metric(service: ServiceProcess, name: str) -> float:
    """Sum of a metric's samples from the service's /metrics (its port is in its ready line)."""
    port = next(int(m.group(1)) for line in service.output if (m := re.search(r"metrics on :(\d+)", line)))
    return scrape(f"http://127.0.0.1:{port}/metrics", name)


def scrape(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#") and line[len(name)] in " {")


def blocks_all_free(stack: Stack) -> bool:
    return all(metric(w, "baton_kv_cache_free_blocks") == metric(w, "baton_kv_cache_total_blocks")
               for w in stack.workers())


def start_stack(model: Path, mode: str = "disaggregated", decode_workers: int = 1,
                api_keys_file: Path | None = None, kv_transport: str = "nixl",
                worker_arg: tuple[str, ...] = ("--num-kv-blocks=512",), router_args: list[str] | None = None) -> Stack:
    args = argparse.Namespace(mode=mode, prefill_workers=1, decode_workers=decode_workers, kv_transport=kv_transport,
                              host="127.0.0.1", port=free_port(), worker_arg=list(worker_arg),
                              router_arg=router_args or [],
                              gpu_memory_utilization=0.9, prefill_memory_share=None,
                              api_keys_file=str(api_keys_file) if api_keys_file else None)
    services: list[ServiceProcess] = []
    try:
        _start_stack(args, str(model), model.name, services)
    except BaseException:
        for service in services:
            service.terminate()
        raise
    return Stack(services, args.port)
