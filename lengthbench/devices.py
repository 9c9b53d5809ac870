"""Devices, autocast and the provenance a stored row records (the device's name, the commit)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path

import numpy as np
import torch

from lengthbench.errors import UsageError


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UsageError(f"unknown device {device!r}; choose from: auto, cpu, cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but no CUDA GPU is available here")
    return torch.device(device)


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def git_sha() -> str:
    if os.environ.get("LENGTHBENCH_GIT_SHA"):
        return os.environ["LENGTHBENCH_GIT_SHA"]
    try:
        top = Path(__file__).resolve().parent.parent
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=top, capture_output=True, text=True,
                              timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(device: torch.device, argv: list[str]) -> dict[str, str]:
    """What every benchmark row records: ``device``, ``created_at`` (UTC), ``git_sha`` and the ``command``
    (``python`` and ``argv``) that measures it again."""
    from datetime import datetime, timezone

    return {"device": device_description(device),
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "git_sha": git_sha(), "command": "python " + " ".join(argv)}


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def to_device(array: np.ndarray | None, device: torch.device, dtype=None):
    """Host array -> device tensor. On CUDA through pinned memory, so the copy is asynchronous and the
    host can queue the next step while the GPU works (a pageable copy waits for the GPU to drain)."""
    if array is None:
        return None
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if dtype is not None:
        tensor = tensor.to(dtype)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
