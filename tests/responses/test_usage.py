"""Usage records: one per request on every endpoint, with the figures the client was told; written
when the client leaves mid-stream, and left behind (then settled 'failed', once) by a gateway killed
with kill -9 mid-stream; reported by `baton usage`.

The workers are simulated (conftest.SimStack), so a long stream is still running whatever the
machine's load when the test acts on it."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import openai

from tests.launcher import wait_for
from tests.responses.conftest import MODEL

ALPHA_KEY_ID = hashlib.sha256(b"sk-alpha").hexdigest()[:12]
LONG = {"max_tokens": 1500, "stream": True}


def records(db: Path, record_id: str | None = None) -> list[dict]:
    with sqlite3.connect(db, timeout=30) as conn:
        conn.row_factory = sqlite3.Row
        query, args = "SELECT * FROM usage_records", ()
        if record_id is not None:
            query, args = query + " WHERE id = ?", (record_id,)
        return [dict(row) for row in conn.execute(query, args)]


def settled(db: Path, record_id: str) -> dict:
    wait_for(lambda: [r["status"] for r in records(db, record_id)] not in ([], ["in_progress"]),
             timeout=30, what=f"the usage record of {record_id} settled")
    [record] = records(db, record_id)
    return record


def test_one_record_per_request_on_every_endpoint(served):
    db, api = served
    chat = api.chat.completions.create(model=MODEL, max_tokens=5, n=2,
                                       messages=[{"role": "user", "content": "hello"}])
    completion = api.completions.create(model=MODEL, prompt="once upon", max_tokens=4)
    response = api.responses.create(model=MODEL, input="hi", max_output_tokens=3)
    chunks = list(api.chat.completions.create(
        model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "hey"}], stream=True,
        stream_options={"include_usage": True}))
    for record_id, usage, endpoint in (
            (chat.id, chat.usage, "/v1/chat/completions"),
            (completion.id, completion.usage, "/v1/completions"),
            (chunks[0].id, chunks[-1].usage, "/v1/chat/completions")):
        record = settled(db, record_id)
        assert (record["prompt_tokens"], record["completion_tokens"]) == (
            usage.prompt_tokens, usage.completion_tokens)
        assert (record["tenant"], record["key_id"], record["endpoint"], record["model"]) == (
            "alpha", ALPHA_KEY_ID, endpoint, MODEL)
        assert record["status"] == "completed" and record["ended_at"] >= record["started_at"]
        assert record["ttft_s"] is not None
    record = settled(db, response.id)
    assert (record["prompt_tokens"], record["completion_tokens"], record["endpoint"]) == (
        response.usage.input_tokens, response.usage.output_tokens, "/v1/responses")


def test_a_client_that_leaves_mid_stream_is_recorded(served):
    db, api = served
    stream = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}],
                                         **LONG)
    first = [next(stream) for _ in range(4)]
    stream.close()
    record = settled(db, first[0].id)
    assert record["status"] == "cancelled"
    assert 3 <= record["completion_tokens"] < LONG["max_tokens"]


def _consume(stream) -> None:
    try:
        for _ in stream:
            pass
    except (openai.APIError, openai.APIConnectionError, OSError):
        pass  # the gateway was killed under it


def test_a_gateway_killed_mid_stream_leaves_its_record(sim):
    db = sim.tmp / "killed.db"
    doomed, url = sim.gateway(db)
    api = openai.OpenAI(base_url=url, api_key="sk-alpha", max_retries=0, timeout=120)
    stream = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}],
                                         **LONG)
    record_id = next(stream).id
    threading.Thread(target=_consume, args=(stream,), daemon=True).start()
    # brought up to date while it runs: what it has served so far is in the store
    wait_for(lambda: any(r["completion_tokens"] >= 5 for r in records(db, record_id)),
             timeout=30, what="the running record updated")
    doomed.process.kill()
    doomed.process.wait(30)
    [left] = records(db, record_id)
    assert left["status"] == "in_progress" and left["completion_tokens"] >= 5
    # any gateway on the store settles it once it has not moved for --usage-stale-after-s
    sim.gateway(db, "--usage-stale-after-s=1")
    record = settled(db, record_id)
    assert record["status"] == "failed"
    assert 5 <= record["completion_tokens"] < LONG["max_tokens"]
    assert len(records(db, record_id)) == 1


def _usage(db: Path, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "baton.services.cli.main", "usage", f"--state-store=sqlite:///{db}",
         *args], capture_output=True, text=True, timeout=60, check=True).stdout


def test_baton_usage_reports_the_records(served):
    db, api = served
    beta = openai.OpenAI(base_url=str(api.base_url), api_key="sk-beta", max_retries=0)
    done = beta.completions.create(model=MODEL, prompt="beta's", max_tokens=3)
    settled(db, done.id)
    mine = [r for r in records(db) if r["tenant"] == "beta"]
    as_json = json.loads(_usage(db, "--tenant=beta", "--format=json", "--since=1h"))
    assert [r["id"] for r in as_json] == [r["id"] for r in mine]
    assert as_json[-1]["completion_tokens"] == done.usage.completion_tokens
    rows = list(csv.DictReader(io.StringIO(_usage(db, "--format=csv"))))
    assert {r["id"] for r in rows} == {r["id"] for r in records(db)}
    table = _usage(db, "--tenant=beta").splitlines()
    assert table[0].split()[:3] == ["started", "tenant", "key_id"]
    assert table[-1].split()[:3] == ["total", str(len(mine)), "requests"]
    assert _usage(db, "--since=2999-01-01", "--format=json").strip() == "[]"
