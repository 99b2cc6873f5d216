"""Where workers come from when they do not register themselves: a static list, or the Kubernetes
EndpointSlices of the worker Service (selected by label), watched so scale-ups and scale-downs reach
the router within seconds.

Both produce the same thing: address -> draining. An endpoint that is terminating but still serving
is a pod being scaled down: it finishes its work but gets nothing new.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)
# the API server ends watches anyway; a bounded one re-lists on a known schedule
WATCH_TIMEOUT_S = 300
RETRY_S = 2.0


def parse_static(workers: str) -> dict[str, bool]:
    """`host:port,host:port` -> address map; ValueError naming the bad entry."""
    out: dict[str, bool] = {}
    for entry in (e.strip() for e in workers.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"worker address {entry!r} is not host:port")
        out[entry] = False
    return out


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _slice_port(endpoint_slice: Any, port_name: str | None) -> int | None:
    ports = endpoint_slice.ports or []
    if port_name is None:
        return ports[0].port if len(ports) == 1 else None
    return next((p.port for p in ports if p.name == port_name), None)


def addresses_from_slices(slices: Iterable[Any], port_name: str | None) -> dict[str, bool]:
    """The workers behind discovery.k8s.io/v1 EndpointSlice objects (the kubernetes client's
    models): address -> draining. Endpoints neither ready nor serving are left out; per the API an
    unset condition means ready."""
    out: dict[str, bool] = {}
    for endpoint_slice in slices:
        port = _slice_port(endpoint_slice, port_name)
        if port is None:
            continue
        for endpoint in endpoint_slice.endpoints or []:
            cond = endpoint.conditions
            ready = cond is None or cond.ready is None or cond.ready
            terminating = cond is not None and bool(cond.terminating)
            serving = ready if cond is None or cond.serving is None else cond.serving
            if not (ready or (terminating and serving)):
                continue
            for host in endpoint.addresses or []:
                out[_join(host, port)] = terminating
    return out


class EndpointSliceWatcher:
    """Lists then watches EndpointSlices on its own thread (the kubernetes client is synchronous)
    and calls `publish` with the full address map after every change; on any error it waits and
    lists again."""

    def __init__(self, namespace: str, label_selector: str, port_name: str | None,
                 publish: Callable[[dict[str, bool]], None], api: Any = None) -> None:
        self.namespace = namespace
        self.label_selector = label_selector
        self.port_name = port_name
        self.publish = publish
        self._api = api
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.DiscoveryV1Api()
        return self._api

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            # the API server may be away for a while: keep the last view and retry
            except Exception as e:
                log.warning("EndpointSlice watch (%s, %s) failed: %s; retrying", self.namespace,
                            self.label_selector, e)
                self._stop.wait(RETRY_S)

    def _list_and_watch(self) -> None:
        from kubernetes import watch

        api = self._client()
        listed = api.list_namespaced_endpoint_slice(self.namespace,
                                                    label_selector=self.label_selector)
        slices = {s.metadata.name: s for s in listed.items}
        self.publish(addresses_from_slices(slices.values(), self.port_name))
        stream = watch.Watch()
        for event in stream.stream(api.list_namespaced_endpoint_slice, self.namespace,
                                   label_selector=self.label_selector,
                                   resource_version=listed.metadata.resource_version,
                                   timeout_seconds=WATCH_TIMEOUT_S):
            if self._stop.is_set():
                stream.stop()
                return
            obj = event["object"]
            if event["type"] == "DELETED":
                slices.pop(obj.metadata.name, None)
            elif event["type"] in ("ADDED", "MODIFIED"):
                slices[obj.metadata.name] = obj
            self.publish(addresses_from_slices(slices.values(), self.port_name))
