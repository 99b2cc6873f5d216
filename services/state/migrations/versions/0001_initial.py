"""The first schema: stored responses and usage records.

Revision ID: 0001
Revises:
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("input_items", sa.Text, nullable=False),
        sa.Column("conversation", sa.Text, nullable=False),
    )
    op.create_index("ix_responses_tenant", "responses", ["tenant"])
    op.create_index("ix_responses_expires_at", "responses", ["expires_at"])
    op.create_table(
        "usage_records",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("adapter", sa.String(255), nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("ttft_s", sa.Float, nullable=True),
    )
    op.create_index("ix_usage_tenant_started", "usage_records", ["tenant", "started_at"])
    op.create_index("ix_usage_status_updated", "usage_records", ["status", "updated_at"])


def downgrade() -> None:
    op.drop_table("usage_records")
    op.drop_table("responses")
