"""Provenance of a measurement: which GPU, driver, versions, commit, date and command made it.

Every data file carries this record, so a figure can say where its numbers came from.
`provenance(command)` needs a CUDA GPU (it reads the device's properties); callers add what is
specific to them (a suite's name, how it timed) to the dict it returns.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess

import torch

from tutorial_kernels.paths import repository_root

COMMIT_VARIABLE = "FA_GIT_COMMIT"


def provenance(command: str) -> dict:
    """{gpu, sm_count, gpu_memory_gib, driver, cuda, cudnn, torch, triton, python, date_utc,
    git_commit, command}: `command` as a user would type it, from the repository root."""
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "driver": nvidia_smi("driver_version"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": portable_command(command),
    }


def portable_command(command: str) -> str:
    """`command` without this machine's paths: a path inside the repository relative to its root, any
    other absolute path as `$OUT/` and its file name (where the run wrote before the file was committed)."""
    root = repository_root()
    words = []
    for word in command.split(" "):
        if word.startswith("/"):
            if root is not None and os.path.abspath(word).startswith(str(root) + os.sep):
                word = os.path.relpath(word, root)
            else:
                word = "$OUT/" + os.path.basename(word.rstrip("/"))
        words.append(word)
    return " ".join(words)


def nvidia_smi(field_name: str) -> str | None:
    """One field of `nvidia-smi --query-gpu` for GPU 0, or None when nvidia-smi is missing or fails."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field_name}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def git_commit() -> str:
    """The commit measured: $FA_GIT_COMMIT when set (a copy of the working tree measured on another
    machine may carry a stale .git), else git's HEAD, else "unknown"."""
    if os.environ.get(COMMIT_VARIABLE):
        return os.environ[COMMIT_VARIABLE]
    root = repository_root()
    if root is None:
        return "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30,
                             check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
