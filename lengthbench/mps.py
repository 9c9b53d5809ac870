"""NVIDIA MPS (the Multi-Process Service) for cells side by side on one GPU.

Several processes on one GPU take turns in time slices; under MPS their kernels run at once, which helps the
small models that leave a GPU idle between kernel launches (``benchmarks/side_by_side.py`` measures it).
``lengthbench sweep --mps auto`` (the
default) starts the control daemon (``nvidia-cuda-mps-control -d``) for the sweep's lifetime when cells share a
GPU, the binary is on the PATH and no daemon runs, and stops it (``quit``) when the sweep ends; while other
processes still use it (a second sweep started meanwhile on the same GPU: a ``quit`` would wait for them and turn
away every new CUDA process until they end) it is left running. A daemon that ran before is used and left as it
is. ``--mps on`` insists (an error where it cannot be had), ``--mps off``
never starts one. Starting a daemon needs the rights to (root on the project's GPU machines).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lengthbench.errors import UsageError

CONTROL = "nvidia-cuda-mps-control"
MODES = ("auto", "on", "off")
QUIT_TIMEOUT_S = 30.0  # quit answers at once where no process uses the daemon; it is sent only then


def pipe_directory() -> Path:
    """Where the control daemon's pipe lies (``CUDA_MPS_PIPE_DIRECTORY``, else MPS's default)."""
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def daemon_running() -> bool:
    """Whether an MPS control daemon serves this pipe directory: a process runs ``nvidia-cuda-mps-control -d``
    with this ``CUDA_MPS_PIPE_DIRECTORY`` (read from ``/proc``; one whose environment cannot be read counts). The
    control pipe stays behind after a daemon quits, so it is no evidence; without ``/proc``, it is all there is."""
    proc = Path("/proc")
    if not proc.is_dir():
        return (pipe_directory() / "control").exists()
    ours = pipe_directory()
    for folder in proc.iterdir():
        if not folder.name.isdigit():
            continue
        try:
            argv = (folder / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        # the binary itself, or a script run through its interpreter (argv[1])
        if not (any(Path(arg.decode(errors="replace")).name == CONTROL for arg in argv[:2]) and b"-d" in argv[1:]):
            continue
        try:
            environment = dict(item.split(b"=", 1) for item in (folder / "environ").read_bytes().split(b"\0")
                               if b"=" in item)
        except OSError:  # not ours to read: count it
            return True
        theirs = environment.get(b"CUDA_MPS_PIPE_DIRECTORY", b"").decode(errors="replace") or "/tmp/nvidia-mps"
        if Path(theirs) == ours:
            return True
    return False


@contextlib.contextmanager
def mps_for_sweep(mode: str, side_by_side: bool, say: Callable[[str], None] = print,
                  wait_seconds: float = 5.0, stop_seconds: float = 30.0) -> Iterator[bool]:
    """Yield whether MPS serves the sweep's cells: with ``side_by_side`` cells and ``mode`` auto or on, a daemon
    that runs already, or one started here and stopped when the block ends."""
    if mode not in MODES:
        raise UsageError(f"unknown --mps {mode!r}; choose from: {', '.join(MODES)}")
    if mode == "off" or not side_by_side:
        yield False
        return
    if daemon_running():
        say("MPS: a control daemon runs already; the cells use it and it is left running")
        yield True
        return
    binary = shutil.which(CONTROL)
    if binary is None:
        if mode == "on":
            raise UsageError(f"--mps on: {CONTROL} is not on the PATH (it comes with the NVIDIA driver)")
        yield False
        return
    started = subprocess.run([binary, "-d"], capture_output=True, text=True, timeout=60)
    if started.returncode != 0:
        why = (started.stderr or started.stdout).strip().splitlines()
        message = f"{CONTROL} -d failed (exit {started.returncode}{': ' + why[-1] if why else ''})"
        if mode == "on":
            raise UsageError(f"--mps on: {message}")
        say(f"MPS: {message}; the cells share the GPU without it")
        yield False
        return
    deadline = time.monotonic() + wait_seconds
    while not daemon_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    say(f"MPS: started {CONTROL} -d for this sweep")
    try:
        yield True
    finally:
        _stop(binary, say, stop_seconds)


def _control(binary: str, command: str, timeout: float) -> str | None:
    """What the control daemon answers ``command``; None where it fails or does not answer within ``timeout``."""
    try:
        done = subprocess.run([binary], input=command + "\n", capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return done.stdout if done.returncode == 0 else None


def daemon_clients(binary: str, timeout: float = 10.0) -> list[int] | None:
    """The processes the daemon's MPS servers serve now (``get_server_list``, ``get_client_list``); None where
    the daemon does not answer."""
    servers = _control(binary, "get_server_list", timeout)
    if servers is None:
        return None
    clients: list[int] = []
    for server in servers.split():
        if server.isdigit():
            listed = _control(binary, f"get_client_list {server}", timeout)
            if listed is None:
                return None
            clients += [int(pid) for pid in listed.split() if pid.isdigit()]
    return clients


def _parent(pid: int) -> int | None:
    try:  # /proc/PID/stat: "pid (name) state ppid ...", the name may hold spaces and parentheses
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _stop(binary: str, say: Callable[[str], None], stop_seconds: float) -> None:
    """Stop the daemon this sweep started, unless other processes use it. The sweep's own workers (children of
    this process) get ``stop_seconds`` to leave it first."""
    deadline = time.monotonic() + stop_seconds
    clients = daemon_clients(binary)
    while clients and time.monotonic() < deadline and all(_parent(pid) == os.getpid() for pid in clients):
        time.sleep(0.1)
        clients = daemon_clients(binary)
    if clients:
        shown = ", ".join(str(pid) for pid in clients[:5]) + (", ..." if len(clients) > 5 else "")
        say(f"MPS: the daemon this sweep started still serves {len(clients)} process"
            f"{'es' if len(clients) > 1 else ''} (pid {shown}), so it is left running; stop it once they end: "
            f"echo quit | {CONTROL}")
        return
    answered = _control(binary, "quit", timeout=QUIT_TIMEOUT_S)
    # quit returns before the daemon has gone: wait for it, so that what runs next finds no daemon
    gone_by = time.monotonic() + stop_seconds
    while answered is not None and daemon_running() and time.monotonic() < gone_by:
        time.sleep(0.1)
    if answered is None or daemon_running():
        say(f"MPS: 'quit' to {CONTROL} {'did not answer' if answered is None else 'was sent'} and the daemon "
            f"still runs; stop it by hand: echo quit | {CONTROL}")
    else:
        say("MPS: stopped the daemon this sweep started")
