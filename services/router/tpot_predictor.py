"""Predicts the time per output token a request would see on a decode worker, from the worker's own
fit of its decode step time against batch rows and context tokens
(baton.services.common.decode_cost), applied to the batch it reported plus this router's placements
it has not reported yet, plus the new request, over the tokens a row gets per step (more than one
where speculative decoding's drafts are accepted).

A request's TPOT is the mean of the steps it waits through, and its context grows while it runs, so
the new row is counted with its prompt and half its output. The batch's other rows grow too, which
this leaves out: the headroom on the SLO (`tpot_slo_headroom`, and its sheddable and critical
variants) is the margin for that and for the fit's error.
"""
from __future__ import annotations

from baton.services.router.worker_state import WorkerState


def predict_tpot_s(worker: WorkerState, prompt_tokens: int, max_tokens: int) -> float | None:
    """The predicted TPOT of one more request on this worker; None when the worker has no fit to go
    by."""
    cost = worker.report.decode_cost if worker.report is not None else None
    if cost is None:
        return None
    rows, context = worker.decode_batch()
    return cost.tpot_s(rows + 1, context + prompt_tokens + max_tokens // 2)


def decode_join_wait_s(worker: WorkerState, step_s: float | None) -> float:
    """How long a request takes to enter the worker's decode batch once its prompt is computed: the
    step in progress, and one step for each request already waiting there (each joins at a step
    boundary)."""
    if step_s is None or worker.report is None:
        return 0.0
    return step_s * (1 + worker.report.num_waiting)
