"""Run the Triton kernels in interpreter mode when there is no GPU.

Triton fixes interpreter mode when it is first imported, and it is also imported indirectly
(transformers -> torch._dynamo). So the root conftest should set TRITON_INTERPRET before
importing anything; this one covers running without it, and reports clearly when too late.
"""
import os
import sys

import pytest
import torch

_TOO_LATE = False
if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    _TOO_LATE = "triton" in sys.modules
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _interpreter_mode_in_effect() -> None:
    if _TOO_LATE:
        pytest.fail(
            "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot "
            "run on CPU; "
            "set it at the top of tests/conftest.py, before any other import",
            pytrace=False,
        )
