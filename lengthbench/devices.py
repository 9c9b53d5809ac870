"""Devices, autocast and the provenance a stored row records (the device's name, the commit)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import subprocess
from pathlib import Path

import numpy as np
import torch

from lengthbench.errors import UsageError

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the NVIDIA driver has


def cuda_failure() -> str | None:
    """Why CUDA does not start where this machine has an NVIDIA GPU and torch was built for CUDA (a GPU in use by
    a quitting MPS daemon, a driver too old for the build, ...); None where CUDA works or was never to be had."""
    if torch.cuda.is_available() or not torch.backends.cuda.is_built():
        return None
    try:
        if not (NVIDIA_GPUS.is_dir() and any(NVIDIA_GPUS.iterdir())):
            return None
    except OSError:
        return None
    try:
        torch.cuda.init()
    except Exception as error:  # torch's message names the CUDA error
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return lines[0] if lines else type(error).__name__
    return "torch.cuda.is_available() is False"


def resolve_device(device: str) -> torch.device:
    """``auto``: the GPU where CUDA works, else the CPU, except on a machine whose NVIDIA GPU CUDA cannot start:
    that is an error (a GPU sweep would otherwise run its cells on the CPU, hours each, without a word)."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        failure = cuda_failure()
        if failure is not None:
            raise UsageError(f"this machine has an NVIDIA GPU but CUDA does not start ({failure}); fix that, or pass "
                             "--device cpu to run on the CPU")
        return torch.device("cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UsageError(f"unknown device {device!r}; choose from: auto, cpu, cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but no CUDA GPU is available here")
    return torch.device(device)


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# The packages whose sources make a measurement (``lengthbench.cli`` and ``lengthbench.models.attention`` lie in
# their folders)
SOURCE_PACKAGES = ("lengthbench", "lengthbench.kernels", "lengthbench.models", "lengthbench.tasks")


def source_folders() -> list[Path]:
    """The folders of :data:`SOURCE_PACKAGES` as installed (an editable install's are the checkout's)."""
    folders = []
    for name in SOURCE_PACKAGES:
        spec = importlib.util.find_spec(name)
        folders += [Path(folder).resolve() for folder in (spec.submodule_search_locations or [] if spec else [])]
    return folders


def source_files() -> list[Path]:
    """The package's Python sources, sorted."""
    files = {p for folder in source_folders() for p in folder.rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(files)


def source_digest(files: list[Path] | None = None) -> str:
    """A digest of the package's sources (each file's path and bytes): two processes that ran the same code
    report the same one."""
    digest = hashlib.sha256()
    for path in source_files() if files is None else files:
        digest.update(str(path).encode())
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"<gone>")
    return digest.hexdigest()[:12]


# The sources as this process imported them: a row made after they changed says so (``git_sha``)
SOURCE_AT_START = source_digest()


def dirty(top: Path, paths: list[Path]) -> bool:
    """Whether the checkout at ``top`` has uncommitted changes to tracked files under ``paths``."""
    inside = [str(p.relative_to(top)) for p in paths if p.is_relative_to(top)]
    if not inside:
        return False
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *inside], cwd=top,
                            capture_output=True, text=True, timeout=5)
    return status.returncode == 0 and bool(status.stdout.strip())


def git_sha() -> str:
    """The commit a row's code is: ``LENGTHBENCH_GIT_SHA`` where set (a copy of the checkout without its
    ``.git``), else the checkout's ``HEAD``, ``-dirty`` added where tracked sources differ from it (as ``git
    describe --dirty``), ``unknown`` outside a checkout; then ``+changed`` where the package's sources changed
    after this process imported them (an editable install edited during a run: which code ran is not certain)."""
    return _commit() + ("+changed" if source_digest() != SOURCE_AT_START else "")


def _commit() -> str:
    if os.environ.get("LENGTHBENCH_GIT_SHA"):
        return os.environ["LENGTHBENCH_GIT_SHA"]
    try:
        top = Path(__file__).resolve().parent.parent
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=top, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty(top, source_folders()) else "") if sha else "unknown"
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
