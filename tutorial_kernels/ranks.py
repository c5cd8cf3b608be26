"""Several processes of one machine as a torch.distributed group: gloo on the CPU (chapter 10's tests,
notebook and lab run 2 and 4 ranks on a laptop), NCCL with one GPU per process.

`run_ranks(fn, world, *args)` starts `world` processes, each calling `fn(rank, world, *args)` inside an
initialised default group, and returns rank 0's return value (picklable; `fn` a module-level function)."""

from __future__ import annotations

import os
import socket
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, backend: str, result_path: str, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # several processes share the cores
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        value = fn(rank, world, *args)
        outcome = ("ok", value)
    except BaseException:  # noqa: BLE001  (the caller reports any rank's failure)
        outcome = ("error", f"rank {rank}:\n{traceback.format_exc()}")
    finally:
        dist.destroy_process_group()
    if rank == 0 or outcome[0] == "error":
        torch.save(outcome, f"{result_path}.{rank}")


def ranks_unavailable(world: int) -> str | None:
    """None if `run_ranks` can form a group of `world` ranks here, else why not: on a machine with a GPU the
    ranks need a GPU each (NCCL; gloo sends no GPU tensor from one process to another, and the kernels run
    on the CPU only where no GPU is present); on the CPU any number runs."""
    if torch.cuda.is_available() and torch.cuda.device_count() < world:
        return f"{world} ranks need {world} GPUs on a machine with GPUs, this one has {torch.cuda.device_count()}"
    return None


def run_ranks(fn, world: int, *args, backend: str | None = None):
    """fn(rank, world, *args) on `world` processes; rank 0's result. backend: "nccl" where there are
    `world` GPUs, else "gloo". Raises RuntimeError carrying a failing rank's traceback, or, without a
    backend named, `ranks_unavailable`'s reason where the ranks cannot run here."""
    if backend is None and (why := ranks_unavailable(world)):
        raise RuntimeError(f"run_ranks: {why}")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result")
        mp.start_processes(_entry, args=(world, _free_port(), backend, path, fn, args), nprocs=world,
                           start_method="spawn")
        for rank in range(world):
            if os.path.exists(f"{path}.{rank}"):
                status, value = torch.load(f"{path}.{rank}", weights_only=False)
                if status == "error":
                    raise RuntimeError(value)
        return torch.load(f"{path}.0", weights_only=False)[1]
