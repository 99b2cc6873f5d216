"""Every setting of every service does something: each field of each settings class (those in
docs/configuration.md) is read, as an attribute, somewhere in services/, operators/ or loadtest/
outside the class that declares it (and its bases). A field only declared is a flag that silently
does nothing."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from baton.services.cli.config_docs import SETTINGS, settings_class

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("services", "operators", "loadtest")


def _attributes_read(exclude: set[tuple[Path, str]],
                     folders: tuple[Path, ...] = tuple(ROOT / d for d in SOURCE_DIRS)) -> set[str]:
    """Names read as `x.name` under `folders`, outside the (file, class) bodies in `exclude`."""
    names: set[str] = set()
    for folder in folders:
        for path in folder.rglob("*.py"):
            skip = {name for file, name in exclude if file == path.resolve()}
            stack: list[ast.AST] = [ast.parse(path.read_text(), filename=str(path))]
            while stack:
                node = stack.pop()
                if isinstance(node, ast.ClassDef) and node.name in skip:
                    continue
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    names.add(node.attr)
                stack.extend(ast.iter_child_nodes(node))
    return names


def _declaring_classes(cls: type) -> set[tuple[Path, str]]:
    return {(Path(inspect.getfile(base)).resolve(), base.__name__) for base in cls.__mro__
            if base.__module__.startswith("baton.") and hasattr(base, "model_fields")}


@pytest.mark.parametrize("cls", [settings_class(path) for _, path in SETTINGS],
                         ids=lambda cls: cls.__name__)
def test_every_setting_is_read_outside_its_class(cls: type) -> None:
    read = _attributes_read(_declaring_classes(cls))
    unread = [name for name in cls.model_fields if name not in read]
    assert unread == [], f"{cls.__name__} settings never read: {unread}"


def test_a_field_read_only_inside_its_class_counts_as_unread(tmp_path: Path) -> None:
    source = tmp_path / "config.py"
    source.write_text("class C:\n    def f(self):\n        return self.inside\n\n\n"
                      "print(c.outside)\n")
    read = _attributes_read({(source.resolve(), "C")}, (tmp_path,))
    assert "outside" in read and "inside" not in read
    assert "enforce_eager" in _attributes_read(set())
