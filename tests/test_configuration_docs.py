"""docs/configuration.md is generated from the settings classes; it must be regenerated when they
change."""
from __future__ import annotations

from pathlib import Path

from baton.services.cli.config_docs import SETTINGS, render, settings_class

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_configuration_page_is_current():
    assert DOC.read_text() == render(
    ), "run: python -m baton.services.cli.config_docs > docs/configuration.md"


def test_every_setting_is_described():
    missing = [
        f"{settings_class(p).__name__}.{n}" for _, p in SETTINGS
        for n, f in settings_class(p).model_fields.items() if not f.description
    ]
    assert not missing, missing
