"""Which adapters a worker serves and where each one is: registered (a PEFT folder, checked when
registered), in host memory (an LRU of `max_cpu_loras`, filled from disk on a loader thread, off the
engine thread), and in one of `max_loras` device slots. A sequence holds its adapter's slot from
admission to its end; a slot nobody holds is reused least recently used first, so an adapter is
never evicted under a running sequence and a waiting one costs no reload (no thrashing).
An adapter being unloaded at runtime is retiring: refused to new requests, still served to the
sequences that have it, and removed once none does (services/engine/lora/runtime.py).
Under tensor parallelism this is rank 0's, and each of its decisions goes to the other ranks
(replicas.py)."""
from __future__ import annotations

from collections import Counter, OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from transformers import PretrainedConfig

from baton.services.engine.config import EngineConfig
from baton.services.engine.lora.adapter import AdapterWeights, read_adapter
from baton.services.engine.lora.modules import (LoRAError, LoRAExists, LoRAModule, LoRANotFound,
                                                parse_lora_modules)
from baton.services.engine.lora.weights import LoRAState, write_slot
from baton.services.engine.sequence import Sequence


@dataclass
class LoRAStats:
    """The adapters' part of a worker's load report and metrics."""
    registered: list[str]
    resident: list[str]  # in a device slot now
    max_loras: int
    slot_loads: int  # adapters copied into a slot since start
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    generation_tokens: dict[str, int] = field(default_factory=dict)


class LoRAManager:
    """Owned by the engine thread; only the loader thread's futures cross over."""

    def __init__(self, config: EngineConfig, model_config: PretrainedConfig, base_name: str,
                 state: LoRAState | None) -> None:
        """state: the model's slot stacks (None for the simulated engine, which has no weights:
        then only the bookkeeping runs)."""
        self.model_config = model_config
        self.base_name = base_name
        self.max_rank = config.max_lora_rank
        self.max_loras = config.max_loras
        self.max_cpu_loras = config.max_cpu_loras or config.max_loras
        self.state = state
        self.replicas = state.replicas if state is not None else None
        self.modules: dict[str, LoRAModule] = {}
        self.host: OrderedDict[str, AdapterWeights] = OrderedDict()
        self.loading: dict[str, Future[AdapterWeights]] = {}
        self.slots: list[str | None] = [None] * config.max_loras
        self.idle_slots: OrderedDict[int, None] = OrderedDict()  # held by nobody, LRU first
        self.users: Counter[str] = Counter()
        self.retiring: set[str] = set()  # unloaded: no new requests, dropped once none runs
        # Dropped after a runtime unload, and kept (the newest max_cpu_loras, their host copies
        # first to go) for requests admitted elsewhere before the unload that arrive here later: a
        # hand-off from a prefill worker, a stream migrated from another worker (`revive`).
        self.retired: OrderedDict[str, LoRAModule] = OrderedDict()
        self.slot_loads = 0
        self.prompt_tokens: Counter[str] = Counter()
        self.generation_tokens: Counter[str] = Counter()
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="lora-loader")
        for module in parse_lora_modules(config.lora_modules):
            self.add(module)

    def read(self, module: LoRAModule) -> AdapterWeights:
        """Reads and checks an adapter (any thread). Raises LoRAError."""
        if module.base_model_name not in (None, self.base_name):
            raise LoRAError(f"LoRA adapter {module.name!r} is for base model "
                            f"{module.base_model_name!r}; this worker serves {self.base_name!r}")
        return read_adapter(module.name, module.path, self.model_config, self.max_rank)

    def add(self, module: LoRAModule, weights: AdapterWeights | None = None) -> None:
        """Registers an adapter, read now unless `weights` already are. Raises LoRAError."""
        self.check_free(module.name)
        weights = weights or self.read(module)
        self.retired.pop(module.name, None)
        self.modules[module.name] = module
        if self.replicas is not None:
            self.replicas.read(module)
        self._keep(weights)

    def check_free(self, name: str) -> None:
        """Whether an adapter may be added under `name`. Raises LoRAExists."""
        if name == self.base_name:
            raise LoRAExists(f"the name {name!r} is the base model's")
        if name in self.retiring:
            raise LoRAExists(f"the LoRA adapter {name!r} is being unloaded; load it again once "
                             "its running requests have finished")
        if name in self.modules:
            raise LoRAExists(f"the LoRA adapter {name!r} has already been loaded")

    def remove(self, name: str) -> None:
        """Unregisters an adapter no sequence holds. Raises LoRANotFound, or LoRAError in use."""
        if name not in self.modules:
            raise LoRANotFound(f"the LoRA adapter {name!r} is not served here")
        if self.users[name]:
            raise LoRAError(f"the LoRA adapter {name!r} is in use by {self.users[name]} requests")
        self._retire(self.modules.pop(name))
        self.retiring.discard(name)
        self.loading.pop(name, None)  # a read under way is dropped: a new load reads anew
        for slot, held in enumerate(self.slots):
            if held == name:
                self.slots[slot] = None
                self.idle_slots.pop(slot, None)

    def check(self, name: str, admitted_elsewhere: bool = False) -> None:
        """Whether a new request may name this adapter. Raises LoRANotFound.

        admitted_elsewhere: the request was admitted before an unload, on another worker (a
        hand-off, a migration): it runs under the adapter while this worker still has it, retiring
        or retired (`revive`), as a request this worker admitted would."""
        if admitted_elsewhere and self.revive(name):
            return
        if name not in self.modules or name in self.retiring:
            raise LoRANotFound(f"the LoRA adapter {name!r} is not served here")

    def revive(self, name: str) -> bool:
        """Registers a retired adapter again as retiring (served to the requests that have it,
        refused to new ones, dropped once none runs); False for one never served or long gone."""
        if name in self.modules:
            return True
        module = self.retired.pop(name, None)
        if module is None:
            return False
        self.modules[name] = module
        self.retiring.add(name)
        return True

    def _retire(self, module: LoRAModule) -> None:
        self.retired[module.name] = module
        while len(self.retired) > self.max_cpu_loras:
            self.retired.popitem(last=False)
        if module.name in self.host:  # kept, but the first the LRU evicts
            self.host.move_to_end(module.name, last=False)

    def acquire(self, seq: Sequence) -> bool:
        """Gives seq its adapter's slot, loading it there if needed; False while the adapter is
        still being read from disk or every slot is held by running sequences. Raises LoRAError
        when the adapter can no longer be read (its files changed since it was registered)."""
        name = seq.lora_name
        if name is None or seq.lora_slot is not None:
            return True
        if name not in self.modules:  # a retiring adapter still serves the sequences it has
            raise LoRANotFound(f"the LoRA adapter {name!r} is not served here")
        slot = next((i for i, held in enumerate(self.slots) if held == name), None)
        if slot is None:
            # Nothing is read while every slot is held: an adapter read now could not run, and a
            # small host cache would only trade waiting adapters back and forth.
            if not self._slot_available():
                return False
            adapter = self._host_copy(name)
            if adapter is None:
                return False
            slot = self._free_slot()
            if self.state is not None:
                write_slot(self.state, slot, adapter)
            if self.replicas is not None:
                self.replicas.fill(slot, name)
            self.slots[slot] = name
            self.slot_loads += 1
        self.idle_slots.pop(slot, None)
        self.users[name] += 1
        seq.lora_slot = slot
        return True

    def release(self, seq: Sequence) -> None:
        """seq no longer computes: its slot may go to another adapter (idempotent)."""
        if seq.lora_slot is None:
            return
        name, slot = seq.lora_name, seq.lora_slot
        seq.lora_slot = None
        self.users[name] -= 1
        if not self.users[name]:
            del self.users[name]
            self.idle_slots[slot] = None

    def count_tokens(self, name: str | None, prompt: int, generated: int) -> None:
        if name is not None:
            self.prompt_tokens[name] += prompt
            self.generation_tokens[name] += generated

    def stats(self) -> LoRAStats:
        return LoRAStats(sorted(self.modules.keys() - self.retiring),
                         sorted(n for n in self.slots if n is not None),
                         self.max_loras, self.slot_loads, dict(self.prompt_tokens),
                         dict(self.generation_tokens))

    def _slot_available(self) -> bool:
        return None in self.slots or bool(self.idle_slots)

    def _free_slot(self) -> int:
        empty = next((i for i, held in enumerate(self.slots) if held is None), None)
        if empty is not None:
            return empty
        slot, _ = self.idle_slots.popitem(last=False)
        return slot

    def _host_copy(self, name: str) -> AdapterWeights | None:
        """The adapter in host memory, or None while the loader thread reads it."""
        if name in self.host:
            self.host.move_to_end(name)
            return self.host[name]
        future = self.loading.get(name)
        if future is None:
            self.loading[name] = self._loader.submit(self.read, self.modules[name])
            if self.replicas is not None:
                self.replicas.read(self.modules[name])
            return None
        if not future.done():
            return None
        del self.loading[name]
        adapter = future.result()  # raises the loader's LoRAError
        self._keep(adapter)
        return adapter

    def _keep(self, adapter: AdapterWeights) -> None:
        self.host[adapter.name] = adapter
        self.host.move_to_end(adapter.name)
        while len(self.host) > self.max_cpu_loras:
            evicted, _ = self.host.popitem(last=False)
            if self.replicas is not None:
                self.replicas.drop(evicted)

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)
