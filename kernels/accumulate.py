"""The precision a kernel computes in: float32 for every activation dtype, float64 for float64
inputs (which the tests use to compare a kernel with its reference at the same precision)."""
import torch
import triton.language as tl


def accumulator(dtype: torch.dtype) -> "tl.dtype":
    return tl.float64 if dtype == torch.float64 else tl.float32
