"""Fixtures shared across the test suite."""
from __future__ import annotations

import os

import torch

# Triton kernels run on CPU tensors only in interpreter mode, which must be chosen before anything
# imports triton (transformers does, through torch._dynamo).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path

import pytest

from baton.services.checkpoints.tiny_model import ARCHS, TinyModelSpec, make_tiny_model
from baton.services.engine.kv import kv_cache

# An engine built without a KV size takes min(2 GiB, a quarter of free memory) on CPU and zeroes
# it: about two seconds apiece on a 2-core machine, for the hundred-odd engines the tests build in
# this process. A quarter GiB (32,768 blocks of the tiny Llama) holds every test's work many times
# over. Processes the tests start (workers, ranks) keep the real default.
kv_cache.DEFAULT_CPU_KV_GIB = 0.25


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny random checkpoint per supported arch (seed 0), made once per test session."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: make_tiny_model(root / arch, TinyModelSpec.preset(arch)) for arch in ARCHS}
