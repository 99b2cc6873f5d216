"""The LoRA adapters loaded at runtime, as the fleet's desired state.

Revision ID: 0002
Revises: 0001
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_lora_adapters",
        sa.Column("model", sa.String(255), primary_key=True),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("loaded_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("runtime_lora_adapters")
