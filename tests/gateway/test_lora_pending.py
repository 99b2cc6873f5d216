"""The gateway's own runtime LoRA updates over the router's reports (lora_updates.with_pending): a
report taken before an update neither revives an unloaded adapter nor hides a loaded one; once a
report agrees, or after PENDING_MAX_S, the reports rule again."""
from __future__ import annotations

import time

from baton.services.gateway.lora_updates import PENDING_MAX_S, with_pending


def test_updates_hold_until_the_reports_agree() -> None:
    now = time.monotonic()
    pending = {"loaded": (True, now), "unloaded": (False, now)}
    stale = frozenset({"kept", "unloaded"})
    assert with_pending(pending, stale) == {"kept", "loaded"}
    assert set(pending) == {"loaded", "unloaded"}
    agreed = frozenset({"kept", "loaded"})
    assert with_pending(pending, agreed) == agreed
    assert pending == {}
    # From here on the reports alone count: another gateway's unload shows.
    assert with_pending(pending, frozenset({"kept"})) == {"kept"}


def test_an_update_the_reports_never_confirm_is_forgotten() -> None:
    pending = {"lost": (True, time.monotonic() - PENDING_MAX_S - 1)}
    assert with_pending(pending, frozenset()) == frozenset()
    assert pending == {}
