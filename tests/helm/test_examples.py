"""The BatonDeployment the README and the operator guide tell users to apply exists as a file, is
the one the guide shows, renders through the chart's `example` values and is valid against the
CRD (schema and CEL rules)."""
from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import yaml

from baton.operators import crd_schema
from baton.operators.schema_checks import apply_defaults, rule_violations
from tests.helm.conftest import CHART, REPO, documents, run_helm

EXAMPLE = REPO / "examples" / "qwen.yaml"
APPLIED = re.compile(r"kubectl apply (?:--server-side )?-f ([^\s`]+)")


def test_every_file_the_docs_apply_exists() -> None:
    for doc in (REPO / "README.md", REPO / "docs" / "operator.md"):
        named = APPLIED.findall(doc.read_text())
        assert named, f"{doc.name} names no file to apply"
        missing = [path for path in named if not (REPO / path).exists()]
        assert not missing, f"{doc.name} applies files that do not exist: {missing}"
    assert "examples/qwen.yaml" in APPLIED.findall((REPO / "README.md").read_text())


def test_the_guide_shows_the_example_file() -> None:
    guide = (REPO / "docs" / "operator.md").read_text()
    shown = guide.split("## Declare a model", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    assert yaml.safe_load(shown) == yaml.safe_load(EXAMPLE.read_text())


def test_the_example_renders_and_is_valid(helm: str, tmp_path: Path) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"example": {
        "enabled": True, "name": example["metadata"]["name"], "spec": example["spec"]}}))
    result = run_helm(helm, "template", "baton", str(CHART), "--namespace",
                      example["metadata"]["namespace"], "-f", str(values))
    assert result.returncode == 0, result.stderr
    [rendered] = [d for d in documents(result.stdout) if d["kind"] == "BatonDeployment"]
    # helm merges the file's spec into the chart's example values, which may add keys
    assert _within(example["spec"], rendered["spec"])
    for doc in (example, rendered):
        schema = crd_schema.open_api_schema("BatonDeployment")
        jsonschema.Draft202012Validator(schema).validate(doc)
        assert rule_violations(schema, apply_defaults(schema, doc)) == []


def _within(part: object, whole: object) -> bool:
    """Whether every key of `part` is in `whole` with the same value (lists compared whole)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and _within(v, whole[k])
                                               for k, v in part.items())
    return part == whole
