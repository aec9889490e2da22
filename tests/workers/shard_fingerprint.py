"""The fingerprint of a (sharded) state for the local checkpoint workers: equal fingerprints mean
every tensor's local part (a DTensor's shard) is equal, byte for byte."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def fingerprint(state: Any) -> dict[str, str]:
    """``{path in the state: "shard|plain:(local shape):sha256 of the local bytes"}`` for every tensor."""
    from torch.distributed.tensor import DTensor

    found: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}/{key}", item)
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                walk(f"{prefix}/{index}", item)
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if isinstance(value, DTensor) else value
            kind = "shard" if isinstance(value, DTensor) else "plain"
            found[prefix] = f"{kind}:{tuple(local.shape)}:" + hashlib.sha256(
                local.detach().contiguous().numpy().tobytes()).hexdigest()

    walk("", state)
    return found
