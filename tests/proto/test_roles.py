"""One Role: the Python enum, both wire enums and the lower-case names agree."""
from typing import get_args

import pytest

from baton.services.common.roles import ROLE_NAMES, Role, RoleName
from baton.v1 import router_pb2 as rpb
from baton.v1 import worker_pb2 as wpb


def test_wire_enums_number_roles_as_the_python_enum() -> None:
    assert {r.name: int(r) for r in Role} == {
        name.removeprefix("ROLE_"): n for name, n in wpb.Role.items() if n}
    assert {r.name: int(r) for r in Role} == {
        name.removeprefix("WORKER_ROLE_"): n for name, n in rpb.WorkerRole.items() if n}


def test_names_spell_the_enum() -> None:
    assert ROLE_NAMES == get_args(RoleName) == ("prefill", "decode", "mixed")
    assert [Role.of(name) for name in ROLE_NAMES] == list(Role)
    with pytest.raises(ValueError, match="role must be one of prefill, decode, mixed"):
        Role.of("both")


def test_mixed_serves_both_phases_and_the_others_their_own() -> None:
    served = {r.label: [p.label for p in (Role.PREFILL, Role.DECODE) if r.serves(p)] for r in Role}
    assert served == {"prefill": ["prefill"], "decode": ["decode"], "mixed": ["prefill", "decode"]}
