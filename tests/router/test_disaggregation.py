from __future__ import annotations

import pytest

from baton.services.router.disaggregation import DisaggInputs, DisaggPolicy, DisaggReason, decide

POLICY = DisaggPolicy(max_local_prefill_tokens=512, max_prefill_queue_s=0.5, local_kv_headroom=2.0)


@pytest.mark.parametrize("uncached, free_blocks, prefill_queue_s, decode_queue_s, remote, reason", [
    (4000, 1000, None, 0.0, False, DisaggReason.NO_PREFILL_WORKER),
    # the decode worker holds the whole prompt
    (0, 1000, 0.0, 0.0, False, DisaggReason.SHORT_PREFILL),
    (512, 0, 0.0, 0.0, False, DisaggReason.SHORT_PREFILL),
    (513, 1000, 0.0, 0.0, True, DisaggReason.LONG_PREFILL),
    (4000, 1000, 0.5, 0.0, True, DisaggReason.LONG_PREFILL),
    # 250 blocks needed, 2x headroom = 500: enough
    (4000, 500, 0.6, 0.0, False, DisaggReason.PREFILL_POOL_BUSY),
    (4000, 500, 0.6, 0.59, False, DisaggReason.PREFILL_POOL_BUSY),
    # a busy pool, but the decode worker is no better
    (4000, 500, 0.6, 0.6, True, DisaggReason.DECODE_BUSIER),
    (4000, 500, 0.6, 9.0, True, DisaggReason.DECODE_BUSIER),
    (4000, 499, 0.6, 0.0, True, DisaggReason.DECODE_KV_LOW),
])
def test_conditional_disaggregation(uncached, free_blocks, prefill_queue_s, decode_queue_s, remote,
                                    reason):
    decision = decide(DisaggInputs(uncached, free_blocks, 16, prefill_queue_s, decode_queue_s),
                      POLICY)
    assert (decision.remote, decision.reason) == (remote, reason)
