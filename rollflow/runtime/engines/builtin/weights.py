"""Read safetensors weights and check them against the served model before anything is copied.

A checkpoint that would leave the model half-updated (an unknown name, a wrong shape, a missing
tensor in a full load) is refused as a whole with a message naming the tensor.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from rollflow.errors import UserError


class WeightsError(UserError):
    """Weights that cannot be loaded into the served model."""


class WeightChecker:
    """Knows the served model's tensor names and shapes (tied tensors count as one)."""

    def __init__(self, model: Any) -> None:
        state = model.state_dict()
        self._shapes = {name: (tuple(t.shape), t.dtype) for name, t in state.items()}
        # names that share storage (tied embeddings): loading any one of them sets all
        by_storage: dict[int, list[str]] = {}
        for name, tensor in state.items():
            by_storage.setdefault(tensor.data_ptr(), []).append(name)
        self._aliases = {name: names for names in by_storage.values() for name in names}

    @property
    def max_upload_bytes(self) -> int:
        """Tensor bytes of the whole model sent as float64 (the widest dtype a checker casts from):
        no valid upload is larger."""
        return sum(8 * math.prod(shape) for shape, _ in self._shapes.values())

    def check(self, tensors: dict[str, torch.Tensor], full: bool) -> dict[str, torch.Tensor]:
        """Return `tensors` cast to the model's dtypes; raise WeightsError naming the first problem."""
        if not tensors:
            raise WeightsError("no tensors given")
        checked = {}
        for name, tensor in tensors.items():
            if name not in self._shapes:
                raise WeightsError(f"unknown tensor {name!r}: the served model has no parameter of that name")
            shape, dtype = self._shapes[name]
            if tuple(tensor.shape) != shape:
                raise WeightsError(
                    f"tensor {name!r} has shape {list(tensor.shape)}, the model's is {list(shape)}"
                )
            if not (tensor.is_floating_point() or dtype == tensor.dtype):
                raise WeightsError(f"tensor {name!r} has dtype {tensor.dtype}, the model's is {dtype}")
            checked[name] = tensor.to(dtype)
        if full:
            missing = [n for n in self._shapes if not any(a in tensors for a in self._aliases[n])]
            if missing:
                raise WeightsError(
                    f"checkpoint lacks {len(missing)} of the model's tensors, e.g. {missing[0]!r}"
                )
        return checked


def read_safetensors_path(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor in a .safetensors file, or in all *.safetensors files of a folder."""
    from safetensors.torch import load_file

    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise WeightsError(f"no *.safetensors files in {root}")
    else:
        raise WeightsError(f"model_path {str(root)!r} does not exist")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(file))
        except Exception as exc:
            raise WeightsError(f"cannot read {file}: {exc}") from None
    return tensors


def read_safetensors_bytes(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as exc:
        raise WeightsError(f"body is not a safetensors payload: {exc}") from None
