"""Background responses: answered at once, polled with GET until they end; cancelled while they
run (on simulated workers slow enough that the run is under way whatever the load), after which
their generation stops and they stay cancelled."""
from __future__ import annotations

import openai
import pytest

from tests.launcher import wait_for
from tests.responses.conftest import MODEL, client
from tests.responses.test_usage import records, settled


def test_a_background_response_is_polled_until_it_ends(stack):
    api = client(stack.url)
    created = api.responses.create(model=MODEL, input="Take your time", background=True,
                                   max_output_tokens=8)
    assert created.background and created.status == "in_progress" and created.output == []
    wait_for(lambda: api.responses.retrieve(created.id).status != "in_progress", timeout=60,
             what="the background response ended")
    done = api.responses.retrieve(created.id)
    assert done.status in ("completed", "incomplete")
    assert done.output_text and 0 < done.usage.output_tokens <= 8
    # it has ended: cancelling it changes nothing
    assert api.responses.cancel(created.id).status == done.status
    [item] = api.responses.input_items.list(created.id).data
    assert item.content[0].text == "Take your time"


def test_a_cancelled_background_response_stops(served):
    db, api = served
    created = api.responses.create(model=MODEL, input="Go on and on", background=True,
                                   max_output_tokens=1500)
    cancelled = api.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    # its generation stopped: the request's usage record settles as cancelled, part-way
    record = settled(db, created.id)
    assert record["status"] == "cancelled" and record["completion_tokens"] < 1500
    assert api.responses.retrieve(created.id).status == "cancelled"
    assert len(records(db, created.id)) == 1
    with pytest.raises(openai.NotFoundError):
        client(str(api.base_url), "sk-beta").responses.cancel(created.id)
