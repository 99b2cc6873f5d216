"""KV tiers through the whole stack with the official `openai` client: a prompt whose blocks other
traffic pushed out of a worker's small device cache comes back from its host tier, reported as
cached tokens, with the same greedy text."""
from __future__ import annotations

import openai
import pytest

from tests.launcher import metric, start_stack, wait_for


@pytest.fixture(scope="module")
def tiered(model):
    # Eight device blocks of 16 tokens: one 80-token prompt at a time fits, two do not.
    stack = start_stack(model, "colocated", gateway_args=["--slos="],
                        worker_arg=("--num-kv-blocks=8", "--kv-offload-host-gib=0.01"))
    yield stack
    stack.stop()


def test_evicted_prefix_comes_back_from_host_as_cached_tokens(tiered, model) -> None:
    client = openai.OpenAI(base_url=tiered.url, api_key="unused", max_retries=0)
    worker = tiered.workers()[0]

    def complete(prompt: list[int]) -> openai.types.Completion:
        return client.completions.create(model=model.name, prompt=prompt, max_tokens=4,
                                          temperature=0)

    first = complete(list(range(100, 180)))  # 80 tokens: five full blocks of 16
    assert first.usage.prompt_tokens_details is None or \
        first.usage.prompt_tokens_details.cached_tokens == 0
    for start in (200, 300):  # other prompts take every device block
        complete(list(range(start, start + 80)))
    wait_for(lambda: metric(worker, "baton_kv_tier_stored_bytes_total") > 0, 30,
             "blocks stored in the host tier")
    again = complete(list(range(100, 180)))
    # Every full block but the last comes back (the last token is computed for its logits).
    assert again.usage.prompt_tokens_details.cached_tokens == 64
    assert again.choices[0].text == first.choices[0].text
    assert metric(worker, "baton_kv_tier_hits_total") >= 64
    assert metric(worker, "baton_prefix_cache_hits_total") == 0  # none of it from the device
