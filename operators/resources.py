"""Names shared by the CRDs, the operator and the chart: API group, kinds, labels, annotations."""
from __future__ import annotations

from baton.services.common.roles import ROLE_NAMES

GROUP = "serving.baton.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

DEPLOYMENT_KIND = "BatonDeployment"
DEPLOYMENT_PLURAL = "batondeployments"
POOL_KIND = "WorkerPool"
POOL_PLURAL = "workerpools"

ROLES = ROLE_NAMES

# Labels on every object the operator makes; the pool label is what the router and Prometheus select
# workers by.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_DEPLOYMENT = f"{GROUP}/deployment"
LABEL_POOL = f"{GROUP}/pool"
LABEL_ROLE = f"{GROUP}/role"
# On a pool's Service (so on its EndpointSlices): the BatonDeployment whose router places work on
# the pool, its own or its gatewayRef's. The router selects workers by it.
LABEL_GATEWAY = f"{GROUP}/gateway"
MANAGED_BY = "baton-operator"

# The ReplicaSet controller removes the pods with the lowest cost first: drained pods get this one.
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DRAINED_COST = "-1000"

SERVICE_MONITOR_GROUP = "monitoring.coreos.com"
SERVICE_MONITOR_VERSION = "v1"


def pool_name(deployment: str, role: str) -> str:
    return f"{deployment}-{role}"


def router_name(deployment: str) -> str:
    return f"{deployment}-router"


def gateway_name(deployment: str) -> str:
    return f"{deployment}-gateway"


def common_labels(deployment: str, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "baton",
        LABEL_INSTANCE: deployment,
        LABEL_COMPONENT: component,
        LABEL_PART_OF: "baton",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_DEPLOYMENT: deployment,
    }


def selector_labels(deployment: str, component: str) -> dict[str, str]:
    """The immutable subset of labels a Deployment selects its pods by."""
    return {LABEL_INSTANCE: deployment, LABEL_COMPONENT: component, LABEL_DEPLOYMENT: deployment}
