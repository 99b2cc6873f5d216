"""LangChain's `ChatOpenAI(...).with_structured_output(...)` (its default: response_format
json_schema) against the stack: the random-weight model's answer parses into the Pydantic model,
which only a grammar can ensure."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import langchain_openai


class Pet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=8)
    species: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


class Household(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=10)
    pets: list[Pet] = Field(min_length=1, max_length=3)


def test_with_structured_output_returns_the_model(colocated, model):
    for seed in range(3):
        llm = langchain_openai.ChatOpenAI(base_url=colocated.url, api_key="unused",
                                          model=model.name, max_tokens=200, temperature=1.0,
                                          seed=seed, max_retries=0)
        result = llm.with_structured_output(Household,
                                            strict=True).invoke("Describe a household with pets.")
        assert isinstance(result, Household) and 1 <= len(result.pets) <= 3
