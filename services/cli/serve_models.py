"""The base models of a local stack: `baton serve --model A --model B` serves both behind one
gateway, each with its own workers (the role flags shape each model's pools alike), the one
router keeping them apart by model. vLLM serves one model, so the form is explicit: --model
repeated, and --served-model-name repeated to name them in the same order (a model without one is
named after its folder). The positional MODEL is the first --model."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelPlan:
    """One base model of the stack: its checkpoint folder and the name clients use."""
    path: str
    name: str


def add_model_arguments(group: argparse._ArgumentGroup) -> None:
    """--model and --served-model-name, each repeatable (the engine's settings of those names
    take one)."""
    group.add_argument(
        "--model", dest="model", action="append", default=argparse.SUPPRESS, metavar="DIR",
        help="Hugging Face checkpoint folder; repeat it to serve several base models behind one "
             "gateway, each with its own workers [default: the embedded tiny model]")
    group.add_argument(
        "--served-model-name", dest="served_model_name", action="append",
        default=argparse.SUPPRESS, metavar="NAME",
        help="Model name clients use, one per --model in the same order (default: the folder's "
             "name)")


def take_models(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Leaves the first model and name in `args` (as the engine's settings read them) and
    returns the others' folders and names; ValueError for more names than models."""
    models = list(getattr(args, "model", []))
    if args.model_path is not None:
        if models and models[0] != args.model_path:
            raise ValueError(f"two models given: {args.model_path} and --model {models[0]} (give "
                             "several as --model A --model B)")
        models = models or [args.model_path]
    names = list(getattr(args, "served_model_name", []))
    if len(names) > max(1, len(models)):
        raise ValueError(f"{len(names)} --served-model-name for {len(models)} --model: give one "
                         "name per model, in the same order")
    for dest, values in (("model", models), ("served_model_name", names)):
        if values:
            setattr(args, dest, values[0])
        elif hasattr(args, dest):
            delattr(args, dest)
    return models[1:], names[1:]


def model_plans(first: ModelPlan, paths: list[str], names: list[str]) -> list[ModelPlan]:
    """The first model, then the others named by their --served-model-name or folder; ValueError
    when two share a name (requests could not tell them apart)."""
    plans = [first, *(ModelPlan(str(Path(path)), names[i] if i < len(names) else Path(path).name)
                      for i, path in enumerate(paths))]
    seen: set[str] = set()
    for plan in plans:
        if plan.name in seen:
            raise ValueError(f"two models are named {plan.name!r}: give each its own "
                             "--served-model-name")
        seen.add(plan.name)
    return plans
