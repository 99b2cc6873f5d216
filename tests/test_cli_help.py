"""`baton --help` answers at once: it imports no subcommand (some import torch and transformers,
seconds), and still lists each with its own help line."""
from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from baton.services.cli.main import COMMANDS, build_parser

PROBE = """
import sys
from baton.services.cli.main import main
try:
    main(["--help"])
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.startswith(("torch", "transformers", "grpc", "fastapi",
                                                       "pydantic", "baton.services.cli.",
                                                       "baton.loadtest"))))
"""


@pytest.mark.parametrize("name", COMMANDS)
def test_the_help_line_is_the_commands_own(name: str) -> None:
    subparsers = build_parser(name)._subparsers._group_actions[0]
    [registered] = subparsers._choices_actions
    assert (registered.dest, registered.help) == (name.replace("_", "-"), COMMANDS[name][1])


def test_help_imports_no_subcommand() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            timeout=60, check=True)
    assert "serve" in result.stdout and "loadtest-compare" in result.stdout  # the help itself
    assert result.stdout.splitlines()[-1] == "['baton.services.cli.main']"


def test_help_answers_in_under_a_second() -> None:
    # CPU seconds of the child, not wall time: a loaded machine stretches the latter, not the former
    def once() -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "baton.services.cli.main", "--help"],
                       capture_output=True, timeout=60, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    assert min(once() for _ in range(3)) < 1.0
