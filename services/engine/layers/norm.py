"""RMSNorm, with the residual add that precedes it in every decoder layer."""
from __future__ import annotations

import torch
from torch import nn

from baton.services.engine.layers.weights import Loadable, copy_checked


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (RMSNorm(x + residual), x + residual); without residual, (RMSNorm(x), x)."""
    if x.is_cuda:
        from baton.kernels.rms_norm import rms_norm as kernel
        shape = x.shape
        out = kernel(x.reshape(-1, shape[-1]), weight, eps,
                     None if residual is None else residual.view(-1, shape[-1]))
        return out.view(shape), x if residual is None else residual
    if residual is not None:
        x = residual + x
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype), x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def weight_loader(self, param: nn.Parameter, loaded: Loadable, name: str,
                      part: int | None = None) -> int:
        return copy_checked(param, loaded, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)[0]

    def add_and_norm(self, x: torch.Tensor,
                     residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(x + residual), x + residual): one fused kernel on CUDA, which may update
        residual in place."""
        return rms_norm(x, self.weight, self.eps, residual)
