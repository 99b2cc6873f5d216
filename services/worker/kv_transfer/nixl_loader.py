"""Finding NIXL and preparing UCX for it: which wheel (per CUDA major), and UCX's settings for GPU
memory.

NIXL ships as `nixl` (a meta package) or as one wheel per CUDA major, `nixl_cu12` / `nixl_cu13`;
install the one that matches the driver's CUDA (`pip install baton[cu12]` or `baton[cu13]`). A wheel
that is present but cannot load (a missing libnixl.so in its hidden `.nixl_cu1X.mesonpy.libs/`, a
CUDA runtime of the wrong major) must say
so: that error, not "not installed", is what an operator needs to see.

For GPU memory, UCX needs its CUDA transports, which these wheels bundle as modules in
`nixl_cu1X.libs/ucx/` but which UCX does not find on its own (ai-dynamo/nixl#1628: VRAM is then
"detected as host" or moved by "software emulation over tcp/lo"). `configure_ucx_for_cuda` points
UCX_MODULE_DIR there and names the transports. tcp stays in UCX_TLS: UCX needs a transport that can
connect endpoints from a worker address (cuda_ipc and sm alone cannot), which is why
`cuda_ipc,cuda_copy,sm,self` failed to create the agent; UCX still moves VRAM over cuda_ipc.

`new_agent` makes NIXL's UCX progress thread sleep while idle: NIXL's Python agent leaves it polling
without pause, a core per worker.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The meta package, then the per-CUDA-major wheels (reordered by `search_order` for torch's CUDA
# build).
NIXL_MODULES = ("nixl", "nixl_cu13", "nixl_cu12")
# cuda_ipc: same-node GPU to GPU; cuda_copy: staging and host<->GPU; sm/self: host memory; tcp:
# wire-up (and the path between nodes when there is no RDMA; add rc or ib for GPUDirect RDMA across
# nodes).
CUDA_UCX_TLS = "cuda_ipc,cuda_copy,sm,tcp,self"
# The progress thread sleeps on UCX's event fd, and NIXL makes it wake at least this often anyway
# (its guard against a UCX event that does not signal the fd); NIXL rounds it up to whole ms.
PROGRESS_WAKEUP_US = 1000
# Serialises the bindings swap in new_agent.
_AGENT_LOCK = threading.Lock()


def search_order(cuda_version: str | None) -> tuple[str, ...]:
    """NIXL_MODULES with the wheel of torch's CUDA major first (both may be installed: the default
    install carries nixl-cu12, baton[cu13] adds nixl-cu13); a CPU build of torch keeps the default
    order."""
    major = (cuda_version or "").split(".")[0]
    preferred = f"nixl_cu{major}"
    if preferred not in NIXL_MODULES:
        return NIXL_MODULES
    return ("nixl", preferred, *(m for m in NIXL_MODULES if m not in ("nixl", preferred)))


def load_nixl() -> tuple[Any, Any]:
    """nixl_agent and nixl_agent_config from the first NIXL package present. Raises ImportError that
    names the real cause when a package is present but fails to load, and the install command when
    none is present."""
    import torch

    failures: list[str] = []
    for name in search_order(torch.version.cuda):
        if importlib.util.find_spec(name) is None:
            continue
        try:
            api = importlib.import_module(f"{name}._api")
        except ImportError as e:
            failures.append(f"{name}: {_describe(e)}")
            continue
        return api.nixl_agent, api.nixl_agent_config
    if failures:
        raise ImportError("NIXL is installed but does not load: " + "; ".join(failures))
    raise ImportError(
        "NIXL is not installed: pip install 'baton[cu12]' or 'baton[cu13]' (the wheel matching the "
        "CUDA major of the driver; nvidia-smi shows it), or nixl-cu12 / nixl-cu13 directly")


def _describe(error: BaseException) -> str:
    """The error and its chain: the binding's own ImportError often wraps the dlopen failure that
    matters."""
    parts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " <- ".join(parts)


def bundled_ucx_module_dir() -> Path | None:
    """The folder of UCX modules (libuct_cuda.so, ...) inside the installed NIXL wheel, if any."""
    import torch

    for name in search_order(torch.version.cuda):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        site = Path(next(iter(spec.submodule_search_locations))).parent
        for candidate in (site / f"{name}.libs" / "ucx", site / f".{name}.mesonpy.libs" / "ucx"):
            if candidate.is_dir():
                return candidate
    return None


def configure_ucx_for_cuda(ucx_tls: str | None = None,
                           environ: dict[str, str] | None = None) -> dict[str, str]:
    """Sets UCX's environment for VRAM before NIXL first loads UCX (UCX reads it once per process).
    Values the operator already set are kept, except that an explicit `ucx_tls` (a Baton setting)
    wins. Returns what it set."""
    env = os.environ if environ is None else environ
    # registered memory carries its type; a stale cache misclassifies VRAM. UCX turns cuda_ipc's
    # GET off on a GPU without active NVLink (openucx/ucx#7566), and a NIXL READ is a GET: without
    # it the read falls back to copying over TCP (0.09 GB/s between two caches on one H200,
    # 2026-11-28; ai-dynamo/nixl#1097, fixed the same way in ai-dynamo/nixl#2208).
    wanted = {"UCX_MEMTYPE_CACHE": "n", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
    module_dir = bundled_ucx_module_dir()
    if module_dir is not None:
        wanted["UCX_MODULE_DIR"] = str(module_dir)
    wanted["UCX_TLS"] = CUDA_UCX_TLS
    applied = {}
    for key, value in wanted.items():
        if key == "UCX_TLS" and ucx_tls:
            value = ucx_tls
        elif key in env:
            continue
        env[key] = value
        applied[key] = value
    if applied:
        log.info("UCX set up for GPU memory: %s", " ".join(f"{k}={v}" for k, v in applied.items()))
    return applied


def new_agent(name: str, listen_port: int, progress_wakeup_us: int = PROGRESS_WAKEUP_US) -> Any:
    """A NIXL agent on the UCX backend with its metadata listener on `listen_port`, whose progress
    thread waits on UCX's events, waking at least every `progress_wakeup_us` (> 0).

    The thread's poll() timeout is NIXL's pthrDelay (ai-dynamo/nixl#347); 0 makes it return at once,
    a busy loop, and nixl_agent sets 0 with no config field to change it. So the bindings' nixlAgent
    is wrapped while the agent is made, to set it. Disabling the thread instead is no fix: host
    memory READs between two such agents then never complete. A NIXL that no longer makes its agent
    through that binding is logged, not refused: it works, at the cost of the core."""
    nixl_agent, nixl_agent_config = load_nixl()
    config = nixl_agent_config(enable_listen_thread=True, listen_port=listen_port,
                               backends=["UCX"])
    api = sys.modules[nixl_agent.__module__]
    with _AGENT_LOCK:
        bindings = getattr(api, "nixlBind", None)
        if bindings is None:
            agent, delayed = nixl_agent(name, config), False
        else:
            wrapped = _DelayedBindings(bindings, progress_wakeup_us)
            api.nixlBind = wrapped
            try:
                agent = nixl_agent(name, config)
            finally:
                api.nixlBind = bindings
            delayed = wrapped.applied
    if not delayed:
        log.warning("NIXL %s: could not set its progress thread's wake-up interval; the thread "
                    "busy-polls UCX (a CPU core) while idle", api.__name__)
    return agent


class _DelayedBindings:
    """NIXL's bindings module, except that agents are made with a progress thread delay."""

    def __init__(self, bindings: Any, pthr_delay_us: int) -> None:
        self._bindings, self._pthr_delay_us, self.applied = bindings, pthr_delay_us, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 (the binding's name)
        config.pthrDelay = self._pthr_delay_us
        self.applied = True
        return self._bindings.nixlAgent(name, config)
