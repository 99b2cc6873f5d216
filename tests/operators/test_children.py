"""The router's flags as the operator renders them from a BatonDeployment."""
from __future__ import annotations

from baton.operators.children import router_args
from baton.operators.settings import OperatorSettings


def test_router_cuts_prompts_into_the_smallest_worker_block_size_compared_as_numbers():
    body = {"metadata": {"name": "qwen", "namespace": "llm"}}
    # engineArgs values are strings in the CRD: as strings "16" < "8", as block sizes 8 is the
    # smaller.
    spec = {
        "router": {"port": 50051, "policy": "prefix-aware"}, "model": {}, "pools": {
            "prefill": {"engineArgs": {"block-size": "16"}},
            "decode": {"engineArgs": {"block-size": "8"}}
        }
    }
    args = router_args(body, spec, OperatorSettings())
    assert args[args.index("--block-size") + 1] == "8"


def test_least_loaded_is_the_default_scorers_with_the_prefix_scorer_off():
    import argparse

    from baton.services.common.settings import add_settings_arguments, settings_from_args
    from baton.services.router.config import RouterConfig
    body = {"metadata": {"name": "qwen", "namespace": "llm"}}
    spec = {"router": {"port": 50051, "policy": "least-loaded"}, "model": {}, "pools": {}}
    args = router_args(body, spec, OperatorSettings())
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, RouterConfig)
    scorers = args[args.index("--scorers"):args.index("--scorers") + 2]
    config = settings_from_args(RouterConfig, parser.parse_args(scorers))
    expected = {e.name: (0.0 if e.name == "prefix_overlap" else e.weight)
                for e in RouterConfig().scorers}
    assert {e.name: e.weight for e in config.scorers} == expected
