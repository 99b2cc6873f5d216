"""The router's flags as the operator renders them from a BatonDeployment."""
from __future__ import annotations

from baton.operators.children import router_args
from baton.operators.settings import OperatorSettings


def test_router_cuts_prompts_into_the_smallest_worker_block_size_compared_as_numbers():
    body = {"metadata": {"name": "qwen", "namespace": "llm"}}
    # engineArgs values are strings in the CRD: as strings "16" < "8", as block sizes 8 is the smaller.
    spec = {"router": {"port": 50051, "policy": "prefix-aware"}, "model": {},
            "pools": {"prefill": {"engineArgs": {"block-size": "16"}}, "decode": {"engineArgs": {"block-size": "8"}}}}
    args = router_args(body, spec, OperatorSettings())
    assert args[args.index("--block-size") + 1] == "8"
