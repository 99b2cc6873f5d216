"""A worker's role: which phases of a request it serves. The one definition every process uses.

Numbered as the wire enums (baton.v1.Role in worker.proto, baton.v1.WorkerRole in router.proto, kept
apart so the two contracts version independently), so a proto value converts with Role(value); named
in lower case (`Role.PREFILL.label == "prefill"`) as configuration, the CLI, the operator's CRD and
the stats JSON spell it. tests/proto/test_roles.py holds the three in step.
"""
from __future__ import annotations

import enum
from typing import Literal

# The role as settings and resources spell it (pydantic and the CRD schema need the literal values).
RoleName = Literal["prefill", "decode", "mixed"]


class Role(enum.IntEnum):
    PREFILL = 1
    DECODE = 2
    MIXED = 3

    @property
    def label(self) -> RoleName:
        return self.name.lower()  # type: ignore[return-value]

    @classmethod
    def of(cls, label: str) -> Role:
        """The role a lower-case name spells; ValueError for anything else."""
        try:
            return cls[label.upper()]
        except KeyError:
            raise ValueError(
                f"role must be one of {', '.join(ROLE_NAMES)}; got {label!r}") from None

    def serves(self, phase: Role) -> bool:
        """Whether a worker in this role runs `phase` (PREFILL or DECODE): mixed workers run
        both."""
        return self is Role.MIXED or self is phase


ROLE_NAMES: tuple[RoleName, ...] = tuple(r.label for r in Role)
