"""SiLU(gate) * up over a stacked gate/up projection's output."""
from __future__ import annotations

import torch
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2 * I], gate then up; returns [T, I]."""
        gate, up = x.chunk(2, dim=-1)
        if gate.is_cuda:
            from baton.kernels.silu_and_mul import silu_and_mul as kernel
            return kernel(gate, up)
        return nn.functional.silu(gate) * up
