"""/v1/models entries (vLLM's ModelCard): the served name, the checkpoint it is (`root`), the model
it adapts (`parent`: None for a base model) and its context limit."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ModelPermission(BaseModel):
    """vLLM's fixed permission entry, which clients that read OpenAI's old model objects expect."""
    id: str
    object: str = "model_permission"
    created: int = 0
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "baton"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = []


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


def model_card(name: str, root: str, max_model_len: int, parent: str | None = None
               ) -> dict[str, Any]:
    return ModelCard(id=name, root=root, parent=parent, max_model_len=max_model_len,
                     permission=[ModelPermission(id=f"modelperm-{name}")]).model_dump()
