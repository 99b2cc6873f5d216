"""One stack per mode for the gateway tests, shared by the whole session (starting one takes
seconds)."""
from __future__ import annotations

import openai
import pytest

from tests.launcher import sim_backend, start_stack

KEYS = """
tenants:
  - name: alpha
    keys: ["sk-alpha"]
  - name: limited
    keys: ["sk-limited"]
    requests_per_minute: 2
  - name: banded
    keys: ["sk-banded"]
    priority: 1
    min_priority: -2
    max_priority: 3
"""


@pytest.fixture(scope="session")
def model(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def disaggregated(model, tmp_path_factory):
    """Prefill and decode workers, with API keys required."""
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(KEYS)
    stack = start_stack(model, "disaggregated", api_keys_file=keys)
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def handoff(model):
    """Disaggregated, every prompt prefilled on the prefill worker and handed off (no local
    prefill)."""
    stack = start_stack(model, "disaggregated", router_args=["--max-local-prefill-tokens=0"])
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def colocated(model):
    """No latency SLOs: on a loaded test machine every step is slow, and the router would refuse
    long requests by predicted TPOT (a 429 in milliseconds) before the tests could see them run."""
    stack = start_stack(model, "colocated", gateway_args=["--slos="])
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def sim_router():
    """A sim worker (50 ms per step) and a router: the router's address, for the tests of the
    gateway's HTTP side, each starting its own gateway over it."""
    with sim_backend() as address:
        yield address


@pytest.fixture(scope="session", params=["disaggregated", "colocated"])
def stack(request):
    return request.getfixturevalue(request.param)


@pytest.fixture
def api_key(stack, disaggregated):
    return "sk-alpha" if stack is disaggregated else "unused"


@pytest.fixture
def client(stack, api_key):
    return openai.OpenAI(base_url=stack.url, api_key=api_key, max_retries=0)


@pytest.fixture
def async_client(stack, api_key):
    return openai.AsyncOpenAI(base_url=stack.url, api_key=api_key, max_retries=0)
