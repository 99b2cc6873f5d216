"""The store's tables. Changing them means a new migration in migrations/versions (the gateway
applies them at start), never an edit of one already released."""
from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, MetaData, String, Table, Text

metadata = MetaData()

# One row per stored response, scoped to its tenant: every read and write names the tenant, so
# another tenant's id is simply not found.
responses = Table(
    "responses", metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(255), nullable=False),
    Column("status", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=True),
    # the response object as the API returns it (JSON text)
    Column("body", Text, nullable=False),
    # this request's input items (JSON list), for GET /v1/responses/{id}/input_items
    Column("input_items", Text, nullable=False),
    # every item of the conversation up to and including this response's output (JSON list): what
    # a request naming it as previous_response_id continues from
    Column("conversation", Text, nullable=False),
    Index("ix_responses_tenant", "tenant"),
    Index("ix_responses_expires_at", "expires_at"),
)

# One row per request served (every endpoint): written 'in_progress' when it starts, settled once
# when it ends, and kept current while it runs, so a gateway killed mid-request leaves what it
# served.
usage = Table(
    "usage_records", metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(255), nullable=False),
    Column("key_id", String(64), nullable=True),
    Column("endpoint", String(64), nullable=False),
    Column("model", String(255), nullable=False),
    Column("adapter", String(255), nullable=True),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("cached_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("status", String(32), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("ended_at", Float, nullable=True),
    Column("ttft_s", Float, nullable=True),
    Index("ix_usage_tenant_started", "tenant", "started_at"),
    Index("ix_usage_status_updated", "status", "updated_at"),
)

# The LoRA adapters loaded at runtime (/v1/load_lora_adapter), one row per base model and adapter:
# the fleet's desired state, which every gateway re-asserts to a router that has forgotten it. An
# unload deletes the row before anything else.
runtime_loras = Table(
    "runtime_lora_adapters", metadata,
    Column("model", String(255), primary_key=True),
    Column("name", String(255), primary_key=True),
    Column("path", Text, nullable=False),
    Column("loaded_at", Float, nullable=False),
)
