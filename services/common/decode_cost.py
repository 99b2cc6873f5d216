"""What a decode step costs this engine, measured: a linear fit of recent step times against the
step's decode rows and their context tokens, which the worker reports so the router can predict the
TPOT of one more request.

Every step with decode rows is a sample, mixed steps (a prompt chunk beside the rows) included: the
TPOT a request sees is the time of all the steps it waits through, so the prefill interference the
worker has been seeing belongs in the fit's intercept. Rows and context rise together, so the two
slopes can trade off against each other; a fit with a negative coefficient is retried without the
context term, and failing that the cost is taken as proportional to the rows (no intercept), which
overstates the marginal row and so errs on the refusing side.

With speculative decoding a step gives a row more than one token: the fit also carries the mean
tokens per row per step over the same steps, and a request's TPOT is a step over that.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

MIN_SAMPLES = 4  # fewer cannot pin three coefficients


@dataclass(frozen=True)
class DecodeCostFit:
    base_s: float
    per_sequence_s: float
    per_token_s: float
    samples: int
    tokens_per_row_step: float = 1.0  # above 1 when speculation accepts drafts

    def step_s(self, rows: int, context_tokens: int) -> float:
        return self.base_s + self.per_sequence_s * rows + self.per_token_s * context_tokens

    def tpot_s(self, rows: int, context_tokens: int) -> float:
        """Time per output token of a row in such a batch."""
        return self.step_s(rows, context_tokens) / self.tokens_per_row_step


class DecodeCostModel:
    def __init__(self, window: int = 128) -> None:
        # (rows, context tokens, seconds, output tokens of the rows)
        self._samples: deque[tuple[int, int, float, int]] = deque(maxlen=window)
        self._fit: DecodeCostFit | None = None

    def record(self, rows: int, context_tokens: int, seconds: float,
               tokens: int | None = None) -> None:
        """tokens: what the rows emitted (None: one each)."""
        if rows > 0 and seconds > 0:
            self._samples.append((rows, context_tokens, seconds,
                                  rows if tokens is None else tokens))
            self._fit = None

    def fit(self) -> DecodeCostFit | None:
        """The current fit (cached until the next sample); None before MIN_SAMPLES steps with decode
        rows."""
        if self._fit is None and len(self._samples) >= MIN_SAMPLES:
            # A snapshot: the stats call reads from the event loop while the engine thread appends.
            data = np.asarray(tuple(self._samples), dtype=float)
            self._fit = replace(_fit(data[:, :3]),
                                tokens_per_row_step=max(1.0, data[:, 3].sum() / data[:, 0].sum()))
        return self._fit


def _fit(data: np.ndarray) -> DecodeCostFit:
    rows, tokens, seconds = data[:, 0], data[:, 1], data[:, 2]
    ones = np.ones_like(rows)
    for columns in ((ones, rows, tokens), (ones, rows)):
        coef = np.linalg.lstsq(np.stack(columns, axis=1), seconds, rcond=None)[0]
        if (coef >= 0).all() and coef[1] > 0:
            per_token = float(coef[2]) if len(coef) == 3 else 0.0
            return DecodeCostFit(float(coef[0]), float(coef[1]), per_token, len(data))
    return DecodeCostFit(0.0, float(seconds.sum() / rows.sum()), 0.0, len(data))
