"""The KV cache is sized from memory when no size is given; an explicit size that cannot fit is a
clear error."""
import pytest
import torch

from baton.services.common.model_config import load_config
from baton.services.engine.kv import kv_cache
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv.kv_cache import KVCacheTooLarge
from baton.services.engine.llm_engine import LLMEngine


@pytest.mark.parametrize("setting", [{"num_kv_blocks": 10**12}, {"kv_cache_memory_gib": 1e7}],
                         ids=["blocks", "gib"])
def test_explicit_size_that_cannot_fit_names_the_sizes(tiny_model_dirs, setting):
    with pytest.raises(KVCacheTooLarge) as e:
        LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), device="cpu", **setting))
    message = str(e.value)
    name, value = next(iter(setting.items()))
    assert f"{name}={value:g}" in message or f"{name}={value}" in message
    assert ("GiB of KV cache" in message and "can be given to it" in message and
            "available" in message)


def test_default_size_comes_from_memory_and_wanted_is_capped(tiny_model_dirs):
    config = load_config(tiny_model_dirs["llama"])
    engine_config = EngineConfig(model=str(tiny_model_dirs["llama"]))
    cpu = torch.device("cpu")
    budget = kv_cache.memory_budget(engine_config, config, torch.float32, cpu)
    per_block = kv_cache.block_bytes(config, engine_config.block_size, torch.float32)
    assert 0 < budget.default <= min(budget.available,
                                     int(kv_cache.DEFAULT_CPU_KV_GIB * kv_cache.GIB))
    assert kv_cache.num_blocks(engine_config, config, torch.float32,
                               cpu) == budget.default // per_block
    assert kv_cache.num_blocks(engine_config, config, torch.float32, cpu, wanted=7) == 7
    most = kv_cache.max_blocks(engine_config, config, torch.float32, cpu)
    assert kv_cache.num_blocks(engine_config, config, torch.float32, cpu, wanted=most * 10) == most
