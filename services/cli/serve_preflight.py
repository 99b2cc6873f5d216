"""What `baton serve` checks before it starts any process, so a mistake is one clear line at once
rather than a worker's traceback after a minute of loading: the model folder, the API-keys file,
the gateway's port, and every process's command line (flags and values, as that process will parse
and validate them)."""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import socket
from pathlib import Path

from pydantic import ValidationError

from baton.services.cli.config_docs import settings_class
from baton.services.common.settings import describe_error, settings_from_args

log = logging.getLogger(__name__)

# The settings classes each command builds from its flags.
COMMAND_SETTINGS = {
    "worker": ("baton.services.worker.config:WorkerConfig",
               "baton.services.engine.config:EngineConfig"),
    "router": ("baton.services.router.server:RouterServiceConfig",
               "baton.services.router.config:RouterConfig"),
    "gateway": ("baton.services.gateway.config:GatewayConfig",),
}


def check_model(model: str | None) -> None:
    if model is None:
        return
    path = Path(model)
    if not path.is_dir():
        raise ValueError(f"model folder {model} does not exist")
    if not (path / "config.json").is_file():
        raise ValueError(f"{model} is not a checkpoint folder: it has no config.json")


def check_keys_file(path: str | None, auth: bool) -> None:
    if path is not None and not Path(path).is_file():
        raise ValueError(f"API-keys file {path} does not exist")
    if auth and path is None:
        raise ValueError("--auth needs --api-keys-file")


def check_port(host: str, port: int) -> None:
    """Whether the gateway could listen there (bound as it binds, so a connection in TIME_WAIT
    does not count as busy, and a listener does)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise ValueError(f"the gateway cannot listen on {host}:{port} (--host, --port): "
                             f"{e.strerror or e}") from None


def check_command(command: str, argv: list[str]) -> None:
    """Raises ValueError, on one line, when `baton COMMAND ARGV` would stop at its flags or their
    values."""
    from baton.services.cli.main import build_parser  # the command's own parser, as it will run

    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            args = build_parser(command).parse_args([command, *argv])
        except SystemExit:
            lines = [line for line in errors.getvalue().splitlines() if line.strip()]
            problem = lines[-1].partition("error: ")[2] if lines else "bad arguments"
            raise ValueError(f"baton {command}: {problem}") from None
    for path in COMMAND_SETTINGS[command]:
        try:
            settings_from_args(settings_class(path), args)
        except ValidationError as e:
            raise ValueError(f"baton {command}: {describe_error(e)}") from None


def worker_tp_size(worker_args: list[str], default: int) -> int:
    """The --tensor-parallel-size (-tp) a worker given these arguments runs at: the last given."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-tp", "--tensor-parallel-size", dest="size", type=int, default=default)
    known, _ = parser.parse_known_args(worker_args)
    return known.size


def pool_layout_args(given: list[str], own: dict[str, list[str]],
                     sizes: dict[str, int]) -> list[str]:
    """Worker arguments that give both pools head-major KV blocks when their tensor-parallel sizes
    differ and no layout was chosen: each decode rank then reads a prefill block's heads as one
    piece, not one per token (docs/sizing.md); an explicit --kv-cache-layout anywhere is kept."""
    if len(set(sizes.values())) == 1:
        return []
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--kv-cache-layout", dest="layout", default=None)
    if any(parser.parse_known_args(args)[0].layout for args in [given, *own.values()]):
        return []
    log.info("the prefill and decode pools run at tensor-parallel sizes %s: both get "
             "--kv-cache-layout HND", sorted(set(sizes.values())))
    return ["--kv-cache-layout=HND"]


def check_tensor_parallel(model: str, sizes: dict[str, int], kv_transport: str) -> None:
    """Each pool's tensor-parallel size (by role) must split the model, and a prefill pool's and a
    decode pool's must hand off (equal, or one dividing the other, over NIXL): each is a one-line
    ValueError before anything starts."""
    if "prefill" in sizes:
        from baton.services.worker.kv_transfer.head_ranges import check_tp_pair
        check_tp_pair(sizes["prefill"], sizes["decode"])
        if max(sizes.values()) > 1 and kv_transport != "nixl":
            raise ValueError(f"--tensor-parallel-size above 1 hands KV off between the pools over "
                             f"--kv-transport nixl only, not {kv_transport}")
    if max(sizes.values()) == 1:
        return
    from baton.services.common.model_config import load_config
    from baton.services.engine.parallel.sharding import check_splits
    config = load_config(Path(model))
    for size in sorted(set(sizes.values())):
        check_splits(config, size)
