"""How a layer takes a checkpoint tensor: the one contract every layer's `weight_loader` keeps.

`weight_loader(param, loaded, name, part=None) -> rows` copies checkpoint tensor `name` (a tensor
or a lazy safetensors slice, read only as far as the layer needs) into the rows of `param` that
`part` names (None: all of them; an index: one part of a stacked projection) and returns how many
rows it filled, so the loader can tell a parameter some of whose parts are missing.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch


class LazyTensor(Protocol):
    """A safetensors slice (`safe_open(...).get_slice(name)`): the shape without reading, then
    only the indexed part is read."""

    def get_shape(self) -> list[int]:
        ...

    def __getitem__(self, index: Any) -> torch.Tensor:
        ...


Loadable = torch.Tensor | LazyTensor


def shape_of(loaded: Loadable) -> tuple[int, ...]:
    return tuple(loaded.shape if isinstance(loaded, torch.Tensor) else loaded.get_shape())


def copy_checked(dst: torch.Tensor, loaded: Loadable, name: str) -> int:
    """Copies all of `loaded` into dst, which must have its shape; returns dst's rows."""
    # copy_ would broadcast a wrongly shaped tensor silently.
    if shape_of(loaded) != tuple(dst.shape):
        raise ValueError(f"checkpoint tensor {name} has shape {shape_of(loaded)}; the model "
                         f"expects {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(loaded[:])
    return dst.shape[0]


def copy_shard(dst: torch.Tensor, loaded: Loadable, name: str, full_shape: tuple[int, ...],
               index: Any) -> int:
    """Copies loaded[index], a tensor-parallel rank's slice of checkpoint tensor `name`, into dst;
    the checkpoint tensor must have the whole layer's shape, full_shape. Only the slice is read."""
    if shape_of(loaded) != tuple(full_shape):
        raise ValueError(f"checkpoint tensor {name} has shape {shape_of(loaded)}; the model "
                         f"expects {tuple(full_shape)} to split across tensor-parallel ranks")
    with torch.no_grad():
        dst.copy_(loaded[index])
    return dst.shape[0]
