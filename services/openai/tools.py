"""OpenAI function tools on /v1/chat/completions: the request's `tools`, `tool_choice` and
`parallel_tool_calls`, the assistant `tool_calls` and `tool` results in the history, and the grammar
that enforces `required` and named choices (so forced arguments always parse and validate against
the function's parameters schema)."""
from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator

from baton.services.common.sampling_params import StructuredOutput

# OpenAI's rule for function names.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# OpenAI's meaning of a function without `parameters`: it takes none.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # forced calls are always grammar-constrained; auto ones never are

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """A JSON schema of an object, as OpenAI requires: arguments are a JSON object."""
        if schema is None:
            return None
        # validator_for would fail on it with a TypeError
        if not isinstance(schema.get("$schema", ""), str):
            raise ValueError("is not a valid JSON schema: $schema must be a string")
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise ValueError(f"is not a valid JSON schema: {e.message}") from None
        if schema.get("type", "object") != "object":
            raise ValueError(
                f"must describe an object (type \"object\"), not type {schema['type']!r}")
        return schema

    def schema(self) -> dict[str, Any]:
        """The arguments' schema; an object even where the parameters leave the type out."""
        return NO_PARAMETERS if self.parameters is None else {"type": "object", **self.parameters}


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class _FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: _FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction

    def for_template(self) -> dict[str, Any]:
        """Templates (Qwen's, Llama's) expect the arguments as a mapping, as transformers
        documents."""
        call = self.model_dump()
        try:
            call["function"]["arguments"] = json.loads(self.function.arguments)
        except json.JSONDecodeError:
            pass  # a template that prints strings as they are still renders it
        return call


def tools_problem(tools: list[Tool] | None, choice: ToolChoice | None) -> tuple[str, str] | None:
    """(field, message) when the tools or the tool_choice cannot be served: names must tell tools
    apart, and a forced choice needs the tool it forces."""
    names = [t.function.name for t in tools or []]
    if len(set(names)) < len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        return ("tools",
                f"tools: function names must be unique; `{duplicate}` is given more than once")
    if choice in (None, "none", "auto"):
        return None
    if not tools:
        return "tool_choice", "tool_choice requires tools; none were given"
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        return (
            "tool_choice",
            f"tool_choice names the function `{choice.function.name}`, which is not among the tools"
        )
    return None


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
            "propertyNames")


def closed_schema(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever an object lists its properties and
    says nothing about others, as vLLM's default grammar backend (xgrammar's strict mode) does:
    otherwise a forced call may append made-up arguments, and a weak model never stops. Everything
    it accepts validates against the original."""
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(closed.get(key), dict):
            closed[key] = {name: closed_schema(sub) for name, sub in closed[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(closed.get(key), list):
            closed[key] = [closed_schema(sub) for sub in closed[key]]
    for key in _SCHEMAS:
        if key in closed:
            closed[key] = closed_schema(closed[key])
    if ("properties" in closed and "additionalProperties" not in closed and
            "patternProperties" not in closed):
        closed["additionalProperties"] = False
    return closed


def _local_refs(node: Any, rewrite: Any) -> Any:
    """`node` with every local `$ref` ("#...") passed through `rewrite` (None: only whether there
    are any, as a bool)."""
    if isinstance(node, list):
        items = [_local_refs(item, rewrite) for item in node]
        return any(items) if rewrite is None else items
    if not isinstance(node, dict):
        return False if rewrite is None else node
    ref = node.get("$ref")
    local = isinstance(ref, str) and ref.startswith("#")
    if rewrite is None:
        return local or any(_local_refs(v, None) for v in node.values())
    out = {k: _local_refs(v, rewrite) for k, v in node.items()}
    if local:
        out["$ref"] = rewrite(ref)
    return out


def _rooted(schema: dict[str, Any], name: str, defs: dict[str, Any]) -> dict[str, Any]:
    """A tool's arguments schema as a part of a larger document: its local references ("#/$defs/x",
    "#") point at the document's root, so the schema moves whole under the root's $defs[name] and
    every reference is prefixed to follow it."""
    if not _local_refs(schema, None):
        return schema
    defs[name] = _local_refs(schema, lambda ref: f"#/$defs/{name}{ref[1:]}")
    return {"$ref": f"#/$defs/{name}"}


def forced_output(tools: list[Tool], choice: ToolChoice | None,
                  parallel: bool) -> StructuredOutput | None:
    """The grammar for a forced choice: a named function's output is its arguments object;
    `required` makes a JSON array of {"name", "arguments"} calls (exactly one when parallel calls
    are off), as in vLLM. Schemas are closed (see closed_schema)."""
    if isinstance(choice, NamedToolChoice):
        function = next(t.function for t in tools if t.function.name == choice.function.name)
        return StructuredOutput("json_schema", json.dumps(closed_schema(function.schema())))
    if choice != "required":
        return None
    defs: dict[str, Any] = {}
    calls = [{
        "type": "object", "properties": {
            "name": {"type": "string", "enum": [t.function.name]},
            "arguments": _rooted(closed_schema(t.function.schema()), f"tool{i}", defs)
        }, "required": ["name", "arguments"], "additionalProperties": False
    } for i, t in enumerate(tools)]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if defs:
        schema["$defs"] = defs
    if not parallel:
        schema["maxItems"] = 1
    return StructuredOutput("json_schema", json.dumps(schema))
