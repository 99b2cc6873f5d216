"""The adapters a worker serves, as vLLM's `--lora-modules` names them: `name=path`, or a JSON
object with `name`, `path` and optionally `base_model_name`."""
from __future__ import annotations

import json
from dataclasses import dataclass


class LoRAError(ValueError):
    """An adapter that cannot be served here; the message is for the client or the operator."""


class LoRANotFound(LoRAError):
    """A request or an unload names an adapter this worker does not serve."""


class LoRAExists(LoRAError):
    """A load names an adapter (or the base model) this worker already serves."""


@dataclass(frozen=True)
class LoRAModule:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModule:
    """One `--lora-modules` word."""
    text = text.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            raise LoRAError(f"--lora-modules: invalid JSON {text!r}: {e}") from None
        if not isinstance(spec, dict) or not {"name", "path"} <= spec.keys():
            raise LoRAError(f"--lora-modules: JSON form needs \"name\" and \"path\": {text!r}")
        unknown = spec.keys() - {"name", "path", "base_model_name"}
        if unknown:
            raise LoRAError(f"--lora-modules: unknown keys {sorted(unknown)} in {text!r}")
        return LoRAModule(str(spec["name"]), str(spec["path"]),
                          None if spec.get("base_model_name") is None
                          else str(spec["base_model_name"]))
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise LoRAError(f"--lora-modules: expected name=path or a JSON object, not {text!r}")
    return LoRAModule(name, path)


def parse_lora_modules(texts: list[str]) -> list[LoRAModule]:
    modules = [parse_lora_module(t) for t in texts]
    names = [m.name for m in modules]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise LoRAError(f"--lora-modules: adapter names given twice: {duplicated}")
    return modules
