"""Renders docs/configuration.md from the services' settings classes, so each setting is documented
once (in its field's description) and the page cannot drift: `python -m
baton.services.cli.config_docs > docs/configuration.md`, checked by
tests/test_configuration_docs.py. It lives with the commands because it loads every service's
settings, which no single service may import."""
from __future__ import annotations

import importlib

from baton.services.common.settings import BatonSettings

# (command, "module:Class") in the order the page lists them.
SETTINGS = (
    ("baton serve", "baton.services.cli.serve_config:ServeConfig"),
    ("baton worker, baton serve, baton run-batch, baton bench throughput (engine)",
     "baton.services.engine.config:EngineConfig"),
    ("baton worker", "baton.services.worker.config:WorkerConfig"),
    ("baton router (service)", "baton.services.router.server:RouterServiceConfig"),
    ("baton router (policy)", "baton.services.router.config:RouterConfig"),
    ("baton gateway, baton serve", "baton.services.gateway.config:GatewayConfig"),
    ("baton operator", "baton.operators.settings:OperatorSettings"),
    ("baton usage", "baton.services.cli.usage:UsageConfig"),
)


def settings_class(path: str) -> type[BatonSettings]:
    """The class a SETTINGS entry names ("module:Class")."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _serve_note() -> list[str]:
    from baton.services.cli.serve_config import GATEWAY_EXCLUDED, PASS_THROUGH, gateway_flags

    def flags(names: list[str] | tuple[str, ...]) -> str:
        return ", ".join(f"`--{n.replace('_', '-')}`" for n in names)

    return [
        "`baton serve` also takes every `EngineConfig` setting below, passed to each worker, and "
        f"these `GatewayConfig` ones, passed to the gateway: {flags(gateway_flags())} (not "
        f"{flags(GATEWAY_EXCLUDED)}, which it sets per process; without `--api-keys-file` or "
        "`--auth` the stack takes no keys). Each comes from its flag, else "
        "its `BATON_<NAME>` variable, else `--config FILE` (YAML keyed by flag name: "
        "`max-model-len: 4096`), else its default. The model may also be given first, as in "
        f"`baton serve DIR`. {flags(tuple(PASS_THROUGH))} pass arguments on as they are "
        "(repeatable; the role's own after `--worker-arg`).", ""
    ]


# Paragraphs after a class's table.
NOTES = {"baton.services.cli.serve_config:ServeConfig": _serve_note}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    lines = [
        "# Configuration", "",
        "Every setting is a command-line flag and a `BATON_<NAME>` environment variable; a flag "
        "wins over the",
        "variable, the variable over the default (for `baton serve`, over its `--config` file, "
        "then the default).",
        "A `BATON_*` variable that is no setting gets a warning when any `baton` command starts.",
        "This page is generated from the settings classes",
        "(`python -m baton.services.cli.config_docs`); their field descriptions are the only "
        "source.",
        ""
    ]
    for command, path in SETTINGS:
        cls = settings_class(path)
        lines += [
            f"## {command}: `{cls.__name__}`", "", "| flag | variable | default | meaning |",
            "|---|---|---|---|"
        ]
        for name, field in cls.model_fields.items():
            flag = "--" + name.replace("_", "-")
            lines.append(f"| `{flag}` | `BATON_{name.upper()}` | `{_cell(repr(field.default))}` | "
                         f"{_cell(field.description or '')} |")
        lines.append("")
        lines += NOTES[path]() if path in NOTES else []
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
