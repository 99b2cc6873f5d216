"""Two gateways sharing one PostgreSQL store: a response created through one is read, listed and
continued through the other, and deleted through either; tenants stay apart across both."""
from __future__ import annotations

import openai
import pytest

from tests.responses.conftest import MODEL, client


def test_a_response_created_through_one_gateway_continues_through_the_other(gateways, pg_url):
    first = client(gateways.get("postgresql", pg_url))
    second = client(gateways.get("postgresql-2", pg_url))
    created = first.responses.create(model=MODEL, input="Remember the number 7.",
                                     max_output_tokens=4)
    assert second.responses.retrieve(created.id).output_text == created.output_text
    continued = second.responses.create(model=MODEL, input="Which number?", max_output_tokens=4,
                                        previous_response_id=created.id)
    assert continued.usage.input_tokens > created.usage.input_tokens
    assert first.responses.retrieve(continued.id).previous_response_id == created.id
    again = first.responses.create(model=MODEL, input="Sure?", max_output_tokens=4,
                                   previous_response_id=continued.id)
    listed = second.responses.input_items.list(again.id).data
    assert [i.content[0].text for i in listed] == ["Sure?"]
    with pytest.raises(openai.NotFoundError):
        client(gateways.get("postgresql-2", pg_url), "sk-beta").responses.retrieve(created.id)
    second.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        first.responses.retrieve(created.id)
