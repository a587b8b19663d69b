"""Where a run executes: device, precision and (under torchrun) the DDP process group.

The same command runs on one CPU, one GPU, several GPUs or several nodes: ``torchrun`` sets ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK``; we pick NCCL on GPU and gloo on CPU. The global batch size is fixed by the
config and split evenly over the processes, so a run's optimisation does not depend on how many there are.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    amp_dtype: torch.dtype | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def autocast(self):
        """bf16 autocast on GPU (when enabled); a no-op context on CPU, where fp32 is faster and exact."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def setup_runtime(device: str = "auto", amp: bool = True) -> Runtime:
    """Initialise the process group when launched by torchrun and choose device and precision."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = pick_device(device)
    if world_size > 1:
        if dev.type == "cuda":
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local_rank)
            dev = torch.device("cuda", local_rank)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls: free speed on Ampere+, ample precision here
        torch.backends.cudnn.allow_tf32 = True
    amp_dtype = torch.bfloat16 if amp and dev.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return Runtime(device=dev, rank=rank, world_size=world_size, amp_dtype=amp_dtype)


def teardown_runtime() -> None:
    """Leave the process group together: a process that tore gloo down while another was still writing its results
    aborted now and then ("terminate called without an active exception", SIGABRT)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    """Sum a tensor over all processes (identity in a single process)."""
    if runtime.distributed:
        values = values.to(runtime.device)
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values
