"""Every setting reads its BATON_* variable in every entry point, `baton serve` included, and an
unknown BATON_* variable gets a one-line warning when any command starts."""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from baton.operators.settings import OperatorSettings
from baton.services.cli.environment import known_variables, unknown_variables
from baton.services.cli.main import build_parser, main
from baton.services.cli.serve_config import resolve
from baton.services.common.settings import settings_from_args
from baton.services.engine.config import EngineConfig
from baton.services.gateway.config import GatewayConfig
from baton.services.router.config import RouterConfig
from baton.services.worker.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[1]


def _serve(args: Any) -> Any:
    return resolve(args)


# (command line, variable, value, what the command makes of it)
CASES: list[tuple[list[str], str, str, Callable[[Any], Any]]] = [
    (["serve"], "BATON_MODE", "colocated", lambda a: _serve(a).serve.mode),
    (["serve"], "BATON_PORT", "8013", lambda a: _serve(a).gateway.port),
    (["serve"], "BATON_MAX_MODEL_LEN", "256", lambda a: _serve(a).engine.max_model_len),
    (["serve"], "BATON_SLOS", "0=1/2", lambda a: _serve(a).gateway.slos),
    (["worker"], "BATON_MAX_NUM_SEQS", "7", lambda a: settings_from_args(EngineConfig, a)
     .max_num_seqs),
    (["worker"], "BATON_ROLE", "decode", lambda a: settings_from_args(WorkerConfig, a).role),
    (["router"], "BATON_QUEUE_MAX_SIZE", "3", lambda a: settings_from_args(RouterConfig, a)
     .queue_max_size),
    (["gateway"], "BATON_PORT", "8013", lambda a: settings_from_args(GatewayConfig, a).port),
    (["operator"], "BATON_AUTOSCALE_INTERVAL_SECONDS", "7.5",
     lambda a: settings_from_args(OperatorSettings, a).autoscale_interval_seconds),
    (["run-batch", "-i", "in", "-o", "out"], "BATON_BLOCK_SIZE", "32",
     lambda a: settings_from_args(EngineConfig, a).block_size),
]


@pytest.mark.parametrize("argv, variable, value, read", CASES,
                         ids=[f"{c[0][0]}-{c[1]}" for c in CASES])
def test_each_entry_point_reads_the_variable(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                             variable: str, value: str,
                                             read: Callable[[Any], Any]) -> None:
    monkeypatch.setenv(variable, value)
    args = build_parser(argv[0].replace("-", "_")).parse_args(argv)
    assert str(read(args)) == value


def test_a_flag_beats_the_variable_for_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_PORT", "8013")
    args = build_parser("serve").parse_args(["serve", "--port", "8014"])
    assert resolve(args).gateway.port == 8014


def test_an_unknown_variable_is_warned_about_once_at_start(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture,
                                                           tmp_path: Path) -> None:
    monkeypatch.setenv("BATON_MAX_MODLE_LEN", "256")
    monkeypatch.setenv("baton_port", "8013")  # read without regard to case: known
    with caplog.at_level(logging.WARNING):
        assert main(["serve", str(tmp_path / "missing")]) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["BATON_MAX_MODLE_LEN is not a Baton setting and is ignored; did you mean "
                        "BATON_MAX_MODEL_LEN?"]


def test_known_names_cover_every_setting_and_the_others() -> None:
    known = known_variables()
    assert {"BATON_MODE", "BATON_MAX_MODEL_LEN", "BATON_SLOS", "BATON_QUEUE_MAX_SIZE",
            "BATON_NAMESPACES", "BATON_CACHE_DIR"} <= known
    assert unknown_variables({"BATON_NUM_THREADS": "1", "BATON_NOPE": "1", "PATH": "/"}) == [
        "BATON_NOPE"]


def test_every_variable_the_project_names_is_known() -> None:
    """A BATON_* name in the code, the deploy files, the docs or the tests that no setting reads
    would be warned about wherever it is set."""
    named = set()
    for folder in ("services", "operators", "loadtest", "deploy", "docs", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".sh", ".Dockerfile",
                                                  ".tpl", ".txt", ".json"}:
                named |= set(re.findall(r"\bBATON_[A-Z0-9][A-Z0-9_]*", path.read_text()))
    named |= set(re.findall(r"\bBATON_[A-Z0-9][A-Z0-9_]*", (ROOT / "Makefile").read_text()))
    # this file's own unknown names
    assert named - known_variables() == {"BATON_MAX_MODLE_LEN", "BATON_NOPE"}
