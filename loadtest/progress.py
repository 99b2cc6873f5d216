"""The progress bar a load test shows while it runs: requests done out of scheduled, and how many
went wrong."""
from __future__ import annotations

import sys

from tqdm import tqdm

from baton.loadtest.stats import OK, RequestResult


class Progress:
    def __init__(self, total: int | None, description: str, enabled: bool = True) -> None:
        # On stderr, so --output-json - or a piped table on stdout stays clean.
        self.bar = tqdm(total=total, desc=description, unit="req", file=sys.stderr,
                        disable=not enabled, dynamic_ncols=True)
        self.not_ok = 0

    def done(self, result: RequestResult) -> None:
        if result.status != OK:
            self.not_ok += 1
            self.bar.set_postfix(refused_or_failed=self.not_ok, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
