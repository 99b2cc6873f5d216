"""The OpenAI and vLLM ways to ask for structured output, turned into the engine's one
StructuredOutput.

OpenAI: `response_format` {"type": "text" | "json_object" | "json_schema", "json_schema": {name,
schema, strict}}.
vLLM: `structured_outputs` {json | regex | choice | grammar | json_object}, and the older
`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. A request may use one of them;
grammars are llguidance Lark.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from baton.services.common.sampling_params import StructuredOutput

# The request fields that carry a structured-output constraint, in the order they are looked at.
FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
          "guided_grammar")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default_factory=dict, alias="schema")
    # Every schema is enforced by the grammar, strict or not.
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is json_schema")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(
                f"json_schema is only allowed when type is json_schema, not {self.type}")
        return self


class StructuredOutputsParams(BaseModel):
    """vLLM's `structured_outputs`: exactly one constraint."""
    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputsParams:
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError(
                "exactly one of json, regex, choice, grammar or json_object must be set")
        return self


def _schema_text(schema: dict[str, Any] | bool | str) -> str:
    return schema if isinstance(schema, str) else json.dumps(schema)


def _from_response_format(fmt: ResponseFormat) -> StructuredOutput | None:
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutput("json_object", "")
    return StructuredOutput("json_schema", _schema_text(fmt.json_schema.schema_))


def _from_structured_outputs(so: StructuredOutputsParams) -> StructuredOutput:
    if so.json_ is not None:
        return StructuredOutput("json_schema", _schema_text(so.json_))
    if so.regex is not None:
        return StructuredOutput("regex", so.regex)
    if so.choice is not None:
        return StructuredOutput("choice", json.dumps(so.choice))
    if so.grammar is not None:
        return StructuredOutput("grammar", so.grammar)
    return StructuredOutput("json_object", "")


def structured_output_of(request: Any) -> tuple[str | None, StructuredOutput | None]:
    """The request field that asks for structured output (None when none does) and the constraint it
    asks for.

    Raises ValueError when more than one field does: which should win is not for the server to
    guess."""
    given = [f for f in FIELDS if getattr(request, f, None) is not None]
    if isinstance(request.response_format,
                  ResponseFormat) and request.response_format.type == "text":
        given.remove("response_format")
    if len(given) > 1:
        raise ValueError(f"{given[1]}: only one of {', '.join(given)} may be set")
    if not given:
        return None, None
    field = given[0]
    value = getattr(request, field)
    if field == "response_format":
        return field, _from_response_format(value)
    if field == "structured_outputs":
        return field, _from_structured_outputs(value)
    if field == "guided_json":
        return field, StructuredOutput("json_schema", _schema_text(value))
    if field == "guided_choice":
        return field, StructuredOutput("choice", json.dumps(value))
    return field, StructuredOutput("regex" if field == "guided_regex" else "grammar", value)
