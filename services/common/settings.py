"""One typed settings class per service; every field is also a `BATON_*` variable and a `--flag`.

Precedence: command-line flag > environment variable > default. Each field's `description` is its
only
documentation: it feeds `--help` and docs/configuration.md.
"""
from __future__ import annotations

import argparse
import types
import typing
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

S = TypeVar("S", bound="BatonSettings")


class BatonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATON_", extra="forbid", validate_default=True)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(annotation: Any) -> Any:
    """The type argparse should convert to, with Optional[...] unwrapped."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _scalar_type(args[0]) if len(args) == 1 else str
    if origin is typing.Literal:
        return type(typing.get_args(annotation)[0])
    return annotation


def add_settings_arguments(parser: argparse.ArgumentParser, settings_cls: type[BatonSettings],
                           exclude: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group(
        f"{settings_cls.__name__} (each also readable from BATON_<NAME>)")
    for name, field in settings_cls.model_fields.items():
        if name in exclude:
            continue
        kind = _scalar_type(field.annotation)
        # Extra spellings another tool's users know (vLLM's -tp).
        aliases = (field.json_schema_extra or {}).get("flag_aliases", [])
        help_text = f"{field.description or ''} [default: {field.default!r}]"
        if kind is bool:
            group.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
            continue
        choices = None
        if typing.get_origin(field.annotation) is typing.Literal:
            choices = list(typing.get_args(field.annotation))
        # A list of scalars takes several words; a list of records (router scorers) is one
        # string its field validator parses.
        is_list = typing.get_origin(kind) is list and typing.get_args(kind)[0] in (str, int, float)
        group.add_argument(
            _flag(name), *aliases, dest=name, default=argparse.SUPPRESS, help=help_text,
            choices=choices, nargs="+" if is_list else None,
            type=typing.get_args(kind)[0] if is_list else kind if kind in (int, float) else str)


def settings_from_args(settings_cls: type[S], args: argparse.Namespace, **overrides: Any) -> S:
    """Only flags the user actually gave override the environment (argparse.SUPPRESS keeps the rest
    out)."""
    given = {k: v for k, v in vars(args).items() if k in settings_cls.model_fields}
    given.update(overrides)
    return settings_cls(**given)


def settings_to_flags(settings: BatonSettings, names: typing.Iterable[str]) -> list[str]:
    """The command-line flags that give another process these fields of `settings` (the inverse
    of add_settings_arguments), for the fields that were set (by a flag, a variable or a file):
    the rest the process takes from its own defaults. An unset value (None, an empty list) has no
    flag and is left out."""
    flags: list[str] = []
    for name in names:
        value = getattr(settings, name)
        if name not in settings.model_fields_set or value is None or value == []:
            continue
        if isinstance(value, bool):
            flags.append(_flag(name) if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, list):
            flags += [_flag(name), *map(str, value)]
        else:
            flags.append(f"{_flag(name)}={value}")
    return flags


def describe_error(error: ValidationError) -> str:
    """A settings validation error on one line, each field named as its flag."""
    return "; ".join(f"{_flag(str(e['loc'][0])) if e['loc'] else 'settings'}: "
                     f"{e['msg'].removeprefix('Value error, ')}" for e in error.errors())
