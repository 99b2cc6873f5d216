"""What a load test sends: each sweep point and the warm-up draw prompts of their own, so no point
finds the last one's prompts in the server's prefix cache."""
from __future__ import annotations

from baton.loadtest.client import Target
from baton.loadtest.scenarios import WorkloadSpec
from baton.loadtest.session import LoadTest


def prompts(test: LoadTest, rate: float, point: int) -> set[tuple[int, ...]]:
    plan, _ = test._schedule(rate, point)
    return {tuple(request.prompt) for _, request in plan}


def test_sweep_points_send_different_prompts_and_each_point_is_reproducible():
    test = LoadTest(Target("http://unused/v1", "m"), WorkloadSpec("synthetic", 512, seed=3),
                    duration_s=20)
    first, second = prompts(test, 2.0, 0), prompts(test, 2.0, 1)
    assert len(first) > 20 and len(second) > 20
    assert not first & second
    assert prompts(test, 2.0, 1) == second


def test_from_args_carries_every_option_through():
    from baton.services.cli.main import build_parser

    args = build_parser("loadtest").parse_args([
        "loadtest", "--url", "http://unused/v1", "--model", "m", "--rate", "1", "--warmup", "8",
        "--block-size", "32", "--no-ignore-eos", "--no-progress", "--slo-ttft-ms", "500"
    ])
    test = LoadTest.from_args(args, WorkloadSpec("synthetic", 512), lambda request: request.prompt)
    assert (test.warmup, test.block_size, test.show_progress,
            test.target.ignore_eos) == (8, 32, False, False)
    assert (test.rate, test.slo.ttft_ms) == (1.0, 500)
