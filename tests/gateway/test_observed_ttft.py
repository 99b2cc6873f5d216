"""The router's TTFT predictor learns from real requests: each choice's release through the
gateway carries the time from placement to its first token, which the router exports per
prefilling worker."""
from __future__ import annotations

from tests.launcher import metric, wait_for

OBSERVED = "baton_router_observed_ttft_seconds"


def test_every_served_choice_reports_its_ttft_to_the_router(client, model, stack):
    before = metric(stack.router, f"{OBSERVED}_count")
    client.completions.create(model=model.name, prompt="Once upon a time", max_tokens=4, n=2)
    list(client.completions.create(model=model.name, prompt="The weather today", max_tokens=4,
                                   stream=True))
    client.chat.completions.create(model=model.name, max_tokens=4,
                                   messages=[{"role": "user", "content": "Name a color."}])
    # Releases follow the responses, so they may land just after.
    wait_for(lambda: metric(stack.router, f"{OBSERVED}_count") >= before + 4, timeout=15,
             what="four observed TTFTs at the router")
