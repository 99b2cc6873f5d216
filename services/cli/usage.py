"""`baton usage --since 24h --tenant acme --format table|csv|json`: the usage records the gateways
wrote to their state store (one per request), for billing and audits."""
from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import sys
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import Field, field_validator

from baton.services.common.settings import (BatonSettings, add_settings_arguments,
                                            settings_from_args)
from baton.services.state.durations import parse_duration
from baton.services.state.urls import engine_url

COLUMNS = ("started", "tenant", "key_id", "endpoint", "model", "status", "prompt_tokens",
           "cached_tokens", "completion_tokens", "ttft_s", "duration_s", "id")
TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens")


class UsageConfig(BatonSettings):
    state_store: str = Field("sqlite:///baton-state.db",
                             description="The gateways' state store (as their --state-store)")
    since: str | None = Field(
        None, description="Only requests started since: a duration back from now (24h, 7d) or "
                          "an ISO date or time in UTC (2026-11-01, 2026-11-01T12:00) (unset: all)")
    tenant: str | None = Field(None, description="Only this tenant's requests (unset: all)")
    format: Literal["table", "csv", "json"] = Field("table", description="Output format")

    @field_validator("state_store")
    @classmethod
    def _valid_store(cls, value: str) -> str:
        engine_url(value)
        return value

    @field_validator("since")
    @classmethod
    def _valid_since(cls, value: str | None) -> str | None:
        if value is not None:
            since_epoch(value)
        return value


def since_epoch(text: str, now: float | None = None) -> float:
    """Epoch seconds for --since; ValueError naming the accepted forms."""
    try:
        return (now if now is not None else datetime.now(timezone.utc).timestamp()) - \
            parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r}: expected a duration (24h, 7d) or an ISO date or "
                         "time (2026-11-01, 2026-11-01T12:00)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "usage", help="report the usage records of the gateways' requests",
        description="List the usage records (one per request: tenant, API key id, model, prompt, "
                    "cached and completion tokens, status, timings) in a state store.")
    add_settings_arguments(parser, UsageConfig)
    parser.set_defaults(func=run)


def _row(record: dict[str, Any]) -> dict[str, Any]:
    started = datetime.fromtimestamp(record["started_at"], timezone.utc)
    ended = record.get("ended_at")
    return {**record, "started": started.isoformat(timespec="seconds"),
            "duration_s": None if ended is None else round(ended - record["started_at"], 3),
            "ttft_s": None if record["ttft_s"] is None else round(record["ttft_s"], 3)}


def render(records: list[dict[str, Any]], form: str) -> str:
    rows = [_row(r) for r in records]
    if form == "json":
        return json.dumps(rows, indent=2) + "\n"
    if form == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()
    totals = {c: sum(r[c] for r in rows) for c in TOKENS}
    table = [list(COLUMNS)] + [["" if r[c] is None else str(r[c]) for c in COLUMNS]
                               for r in rows]
    table.append(["total", f"{len(rows)} requests", "", "", "", "",
                  *(str(totals[c]) for c in TOKENS), "", "", ""])
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() + "\n"
                   for line in table)


async def _query(config: UsageConfig) -> list[dict[str, Any]]:
    from baton.services.state.store import StateStore
    from baton.services.state.usage_repo import query_usage

    store = StateStore(config.state_store)
    try:
        since = since_epoch(config.since) if config.since else None
        return await query_usage(store, since, config.tenant)
    finally:
        await store.close()


def run(args: argparse.Namespace) -> int:
    from baton.services.state.urls import StoreUnavailable

    try:
        config = settings_from_args(UsageConfig, args)
        records = asyncio.run(_query(config))
    except (ValueError, StoreUnavailable) as e:
        print(f"baton usage: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render(records, config.format))
    return 0
