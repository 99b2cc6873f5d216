"""Greedy outputs with CUDA graphs on and off, token for token (issue 12). Usage: python
graphs_token_exact.py MODEL_DIR OUT.json. Batch sizes cross several graph buckets and the eager
fallback above the largest one."""
import gc
import json
import random
import sys

import torch

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

model, out = sys.argv[1], sys.argv[2]
rng = random.Random(0)
prompts = [[rng.randrange(300, 100000) for _ in range(rng.randrange(16, 600))] for _ in range(96)]
params = [
    SamplingParams(max_tokens=rng.randrange(8, 96), temperature=0.0, ignore_eos=True)
    for _ in prompts
]
results = {}
for eager in (True, False):
    engine = LLMEngine(
        EngineConfig(model=model, enforce_eager=eager, max_num_seqs=64,
                     cuda_graph_max_batch_size=48, enable_prefix_caching=False))
    results[eager] = [o.token_ids for o in engine.generate(prompts, params)]
    graphs = engine.runner.graphs
    print(
        f"enforce_eager={eager}: graphs captured {graphs.captured}, bucketed decode steps "
        f"{graphs.replays}",
        flush=True)
    del engine
    gc.collect()
    torch.cuda.empty_cache()
same = [a == b for a, b in zip(results[True], results[False])]
first_diff = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
              for a, b in zip(results[True], results[False])]
doc = {
    "requests": len(prompts), "identical": sum(same),
    "first_divergence": [d for d in first_diff if d is not None],
    "device": torch.cuda.get_device_name()
}
print(json.dumps(doc), flush=True)
json.dump(doc, open(out, "w"), indent=1)
sys.exit(0 if all(same) else 1)
