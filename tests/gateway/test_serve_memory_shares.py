"""`baton serve` gives every worker a share of the one GPU they run on; on the CPU the shares are
ignored."""
from __future__ import annotations

import pytest

from baton.services.cli.main import main
from baton.services.cli.serve import memory_shares


@pytest.mark.parametrize("roles, total, prefill_share, expected", [
    (["prefill", "decode"], 0.9, None, [0.45, 0.45]),
    (["prefill", "decode"], 0.9, 0.3, [0.27, 0.63]),
    (["prefill", "decode", "decode"], 0.9, 0.4, [0.36, 0.27, 0.27]),
    (["prefill", "prefill", "decode"], 0.6, None, [0.2, 0.2, 0.2]),
    # colocated: no prefill pool, the share does not apply
    (["mixed", "mixed"], 0.8, 0.3, [0.4, 0.4]),
])
def test_memory_shares_split_the_total(roles: list[str], total: float, prefill_share: float | None,
                                       expected: list[float]) -> None:
    shares = memory_shares(roles, total, prefill_share)
    assert shares == pytest.approx(expected)
    assert sum(shares) == pytest.approx(total)


@pytest.mark.parametrize("total, prefill_share, message", [
    (0.0, None, "--gpu-memory-utilization must be in"),
    (1.5, None, "--gpu-memory-utilization must be in"),
    (0.9, 1.0, "--prefill-memory-share must be strictly between 0 and 1"),
    (0.9, 0.0, "--prefill-memory-share must be strictly between 0 and 1"),
])
def test_memory_shares_refuse_impossible_splits(total: float, prefill_share: float | None,
                                                message: str) -> None:
    with pytest.raises(ValueError, match=message):
        memory_shares(["prefill", "decode"], total, prefill_share)


def test_serve_refuses_a_bad_share_before_starting_anything(
        caplog: pytest.LogCaptureFixture) -> None:
    assert main(["serve", "--port", "0", "--prefill-memory-share", "1.2"]) == 2
    assert "--prefill-memory-share must be strictly between 0 and 1" in caplog.text
