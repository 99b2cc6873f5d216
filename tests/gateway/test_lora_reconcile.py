"""When a gateway re-reads its LoRA record for the router (lora_reconcile.LoRAReconciler): the
router's stats wake it when they lose an adapter they listed (the router restarted, or another
gateway unloaded it) or lack one of the record as last read; an adapter of a model the router does
not route, or an entry only the router holds, never does."""
from __future__ import annotations

import asyncio

import grpc

from baton.services.common.messages.router import ModelStats
from baton.services.gateway.lora_reconcile import LoRAReconciler
from baton.services.gateway.lora_record import LoRARecord


def _stats(*adapters: str, model: str = "m") -> list[ModelStats]:
    return [ModelStats(model, runtime_loras=tuple((a, f"/a/{a}") for a in adapters))]


def test_the_router_forgetting_an_adapter_wakes_the_reconcile() -> None:
    async def run() -> None:
        record = LoRARecord(None)
        # no router answers there: a reconcile reads the record, then gives up until woken
        reconciler = LoRAReconciler(record, grpc.aio.insecure_channel("127.0.0.1:1"), 3600)
        reconciler.router_reports(_stats())
        reconciler.router_reports(_stats("x"))  # another gateway's load
        assert not reconciler.due
        reconciler.router_reports(_stats())  # a new router, or an unload
        assert reconciler.due
        await record.add("m", "y", "/a/y")
        await record.add("other", "z", "/a/z")
        assert await reconciler.reconcile() == 0
        reconciler.router_reports(_stats("x", "y"))
        reconciler.router_reports(_stats("x", "y", "extra"))
        assert not reconciler.due, "z's model is not routed there; extra is the router's own"
        reconciler.router_reports(_stats("x"))
        assert reconciler.due, "the router lacks y of the record"
    asyncio.run(run())


def test_the_memory_record_is_the_record_without_a_store() -> None:
    async def run() -> None:
        record = LoRARecord(None)
        await record.add("m", "x", "/a/x")
        await record.add("m", "x", "/a/x2")
        await record.add("m", "y", "/a/y")
        await record.remove("m", "y")
        await record.remove("m", "never")
        assert await record.all() == {("m", "x"): "/a/x2"}
    asyncio.run(run())
