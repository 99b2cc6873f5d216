"""Plugins by name, as llm-d's scheduler configures them: a scorer or filter class registers itself
under its `name`, and the router builds its weighted scorer list from `RouterConfig.scorers`
(`name:weight,...`), so a new scorer is one class with a decorator and nothing else to wire."""
from __future__ import annotations

from typing import TypeVar

from baton.services.router.plugins.base import Filter, Scorer

SCORERS: dict[str, type[Scorer]] = {}
FILTERS: dict[str, type[Filter]] = {}

S = TypeVar("S", bound=type[Scorer])
F = TypeVar("F", bound=type[Filter])


def register_scorer(cls: S) -> S:
    if cls.name in SCORERS:
        raise ValueError(f"scorer {cls.name!r} registered twice")
    SCORERS[cls.name] = cls
    return cls


def register_filter(cls: F) -> F:
    if cls.name in FILTERS:
        raise ValueError(f"filter {cls.name!r} registered twice")
    FILTERS[cls.name] = cls
    return cls


def scorer_class(name: str) -> type[Scorer]:
    _load_builtins()
    try:
        return SCORERS[name]
    except KeyError:
        raise ValueError(f"unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}") from None


def filter_class(name: str) -> type[Filter]:
    _load_builtins()
    try:
        return FILTERS[name]
    except KeyError:
        raise ValueError(f"unknown filter {name!r}; known: {', '.join(sorted(FILTERS))}") from None


def _load_builtins() -> None:
    # Importing the modules runs their decorators; here rather than at the top because they
    # import this module for those decorators.
    from baton.services.router.plugins import filters, scorers  # noqa: F401
