"""Adapters loaded and unloaded while the engine serves (vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter, reached through the worker's LoadLoRAAdapter and UnloadLoRAAdapter).

A load reads and checks the adapter on the caller's thread (`read`, off the engine thread: a large
adapter takes a while to read); only registering it (`load`) runs on the engine thread, so the batch
never waits on the disk. An unload refuses new requests for the adapter at once, lets the ones the
engine already has finish under it, and drops it after the step where the last one ends
(`drop_retired`, run after every step). Requests admitted before the unload on another worker (a
prefill worker's hand-off, a migrated stream) still run under it when they arrive later
(`LoRAManager.revive`), so an unload never breaks a request between its prefill and its decode."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from baton.services.engine.lora.adapter import AdapterWeights
from baton.services.engine.lora.manager import LoRAManager
from baton.services.engine.lora.modules import LoRAError, LoRAModule

if TYPE_CHECKING:
    from baton.services.engine.llm_engine import LLMEngine


class LoRAOff(LoRAError):
    """The worker was started without --enable-lora: it has no slots to load an adapter into."""


def manager_of(engine: LLMEngine) -> LoRAManager:
    if engine.lora is None:
        raise LoRAOff("LoRA is off on this worker (start it with --enable-lora or --lora-modules)")
    return engine.lora


def read(engine: LLMEngine, module: LoRAModule) -> AdapterWeights:
    """Reads and checks the adapter against the engine's base model (any thread). Raises
    LoRAError; LoRAExists early for a name already served (load checks again)."""
    manager = manager_of(engine)
    manager.check_free(module.name)
    return manager.read(module)


def load(engine: LLMEngine, module: LoRAModule, weights: AdapterWeights) -> None:
    """Serves an adapter `read` returned (engine thread). Raises LoRAExists."""
    manager_of(engine).add(module, weights)


def unload(engine: LLMEngine, name: str) -> int:
    """Refuses new requests for the adapter and drops it once the engine's requests under it have
    ended (engine thread); returns how many are still to end. Raises LoRANotFound."""
    manager = manager_of(engine)
    manager.check(name)
    manager.retiring.add(name)
    drop_retired(engine)
    return in_flight(engine)[name]


def in_flight(engine: LLMEngine) -> Counter[str]:
    """Requests the engine has (waiting, running, or reserved for a hand-off) per adapter."""
    return Counter(seq.lora_name for seq in engine.seqs.values() if seq.lora_name is not None)


def drop_retired(engine: LLMEngine) -> None:
    """Removes the retiring adapters no request uses any more (engine thread, after a step)."""
    manager = engine.lora
    if manager is None or not manager.retiring:
        return
    counts = in_flight(engine)
    for name in sorted(manager.retiring):
        # a revived adapter being read back from disk waits for its read (`LoRAManager.revive`)
        reading = name in manager.loading and not manager.loading[name].done()
        if not counts[name] and not manager.users[name] and not reading:
            manager.remove(name)
