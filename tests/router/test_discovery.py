"""Worker discovery: the static list and the translation of EndpointSlices into the router's worker
set."""
from __future__ import annotations

import pytest
from kubernetes.client import (DiscoveryV1EndpointPort, V1Endpoint, V1EndpointConditions,
                               V1EndpointSlice, V1ObjectMeta)

from baton.services.router.discovery import addresses_from_slices, parse_static


def endpoint_slice(name: str, endpoints: list[V1Endpoint],
                   ports: list[tuple[str | None, int]]) -> V1EndpointSlice:
    return V1EndpointSlice(address_type="IPv4", metadata=V1ObjectMeta(name=name),
                           endpoints=endpoints,
                           ports=[DiscoveryV1EndpointPort(name=n, port=p) for n, p in ports])


def endpoint(ip: str, ready: bool | None = True, serving: bool | None = None,
             terminating: bool | None = None) -> V1Endpoint:
    return V1Endpoint(addresses=[ip], conditions=V1EndpointConditions(ready=ready, serving=serving,
                                                                      terminating=terminating))


def test_static_list_parses_and_names_the_bad_entry():
    assert parse_static("10.0.0.1:50051, worker-1.svc:7000,") == {
        "10.0.0.1:50051": False, "worker-1.svc:7000": False
    }
    with pytest.raises(ValueError, match="'nohost'"):
        parse_static("10.0.0.1:1,nohost")
    with pytest.raises(ValueError, match="99999"):
        parse_static("h:99999")


def test_endpoint_slices_become_workers_and_terminating_ones_drain():
    slices = [
        endpoint_slice(
            "w-abc",
            [
                endpoint("10.0.0.1"),
                endpoint("10.0.0.2", ready=None),
                # not ready and not terminating: left out
                endpoint("10.0.0.3", ready=False),
                # scaling down
                endpoint("10.0.0.4", ready=False, serving=True, terminating=True),
                endpoint("10.0.0.5", ready=False, serving=False, terminating=True)
            ],
            [("metrics", 9090), ("grpc", 50051)]),
        endpoint_slice("w-def", [endpoint("fd00::7")], [("grpc", 50051)]),
        # no grpc port: not a worker slice
        endpoint_slice("w-other", [endpoint("10.0.0.9")], [("http", 80)]),
    ]
    assert addresses_from_slices(slices, "grpc") == {
        "10.0.0.1:50051": False, "10.0.0.2:50051": False, "10.0.0.4:50051": True,
        "[fd00::7]:50051": False
    }
    # Without a port name, only single-port slices say which port to use.
    assert addresses_from_slices(slices, None) == {"[fd00::7]:50051": False, "10.0.0.9:80": False}
