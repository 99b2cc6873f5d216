"""`baton operator`: the Kubernetes operator (BatonDeployments, WorkerPools, the autoscaler), run
with kopf."""
from __future__ import annotations

import argparse
import logging

from baton.services.common.settings import add_settings_arguments, settings_from_args

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    from baton.operators.settings import OperatorSettings

    parser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator",
        description="Reconcile BatonDeployments and WorkerPools into Deployments, Services, PDBs "
                    "and ServiceMonitors, and autoscale the pools. Uses in-cluster credentials, "
                    "else the kubeconfig."
    )
    add_settings_arguments(parser, OperatorSettings)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # kopf and the Kubernetes client load only when the operator actually runs, not for every
    # `baton` command.
    import kopf
    from prometheus_client import start_http_server

    from baton.operators.handlers import register as register_handlers
    from baton.operators.settings import OperatorSettings

    config = settings_from_args(OperatorSettings, args)
    if config.metrics_port:
        start_http_server(config.metrics_port)
    registry = kopf.OperatorRegistry()
    register_handlers(registry, config)
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    log.info("watching %s", ", ".join(config.namespaces) or "all namespaces")
    kopf.run(registry=registry, memo=kopf.Memo(config=config), standalone=True,
             liveness_endpoint=liveness, clusterwide=not config.namespaces,
             namespaces=config.namespaces)
    return 0
