"""`--config FILE`: a command's settings from YAML, as vLLM's `--config` takes them: each key is a
flag's name, with dashes or underscores (`max-model-len: 4096`, `max_num_seqs: 128`). A flag beats
a BATON_* variable, which beats the file, which beats the default."""
from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

import yaml

from baton.services.common.settings import BatonSettings

S = TypeVar("S", bound=BatonSettings)


def load_config_file(path: str, known: Collection[str]) -> dict[str, Any]:
    """The file's settings by field name. ValueError, on one line, for a file that cannot be read,
    is not a YAML mapping, or has a key that is none of `known` (field names)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ValueError(f"--config {path}: not valid YAML{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of settings (max-model-len: 4096, "
                         f"...), not a {type(data).__name__}")
    values = {}
    for key, value in data.items():
        name = str(key).removeprefix("--").replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0].replace('_', '-')}?)" if close else ""
            raise ValueError(f"--config {path}: unknown setting {key!r}{hint}")
        values[name] = value
    return values


def in_environment(name: str) -> bool:
    """Whether BATON_<NAME> is set (matched without regard to case, as the settings read it)."""
    wanted = f"BATON_{name}".upper()
    return any(key.upper() == wanted for key in os.environ)


def settings_with_file(settings_cls: type[S], args: argparse.Namespace,
                       from_file: dict[str, Any]) -> S:
    """settings_cls from the flags given in `args`, then BATON_* variables, then the file's
    values, then the defaults."""
    given = {k: v for k, v in vars(args).items() if k in settings_cls.model_fields}
    filed = {k: v for k, v in from_file.items()
             if k in settings_cls.model_fields and k not in given and not in_environment(k)}
    return settings_cls(**filed, **given)
