"""Where a run executes: device, precision and (under torchrun) the DDP process group.

The same command runs on one CPU, one GPU, several GPUs or several nodes: ``torchrun`` sets ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK``; we pick NCCL on GPU and gloo on CPU. The global batch size is fixed by the
config and split evenly over the processes, so a run's optimisation does not depend on how many there are.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
import torch.distributed as dist

from mem_core.device import pick_device


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    amp_dtype: torch.dtype | None = None  # autocast of training and evaluation (bf16 on a GPU)
    train_amp_dtype: torch.dtype | None = None  # autocast of the training steps alone (bf16 on a CPU that has it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` on this device, in place; on the CPU its convolution weights channels-last (NHWC), oneDNN's
        layout, which the convolutions' outputs then follow: cpu-small's pretraining and finetuning steps (a
        ResNet-18 stem) are 7-10 % faster, a model without convolutions is unchanged (docs/BENCHMARKS.md)."""
        model.to(self.device)
        if self.device.type == "cpu":
            model.to(memory_format=torch.channels_last)
        return model

    def autocast(self):
        """Evaluation and inference: bf16 autocast on GPU (when enabled); a no-op context on CPU (fp32)."""
        return self._autocast(self.amp_dtype)

    def train_autocast(self):
        """The training step: as ``autocast``, and bf16 on a CPU with native bf16 when the config asks for it
        (``cpu_bf16``), where it is faster; validation stays in fp32, so what a run reports is what ``mem
        evaluate``, an export and the live server compute."""
        return self._autocast(self.amp_dtype or self.train_amp_dtype)

    def _autocast(self, dtype: torch.dtype | None):
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)


@cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (x86 AVX512-BF16 or AMX-BF16, read from ``/proc/cpuinfo``).
    Elsewhere oneDNN emulates bf16, slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def setup_runtime(device: str = "auto", amp: bool = True, cpu_bf16: bool = False) -> Runtime:
    """Initialise the process group when launched by torchrun and choose device and precision: bf16 autocast on a
    GPU with ``amp``; bf16 training steps on a CPU with ``cpu_bf16`` where the CPU has native bf16 (else fp32, with a
    warning)."""
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
    train_amp_dtype = None
    if cpu_bf16 and dev.type == "cpu":
        if cpu_has_native_bf16():
            train_amp_dtype = torch.bfloat16
        else:
            warnings.warn(
                "cpu_bf16 = true, but this CPU has no native bf16 (AVX512-BF16 or AMX): training in fp32", stacklevel=2
            )
    return Runtime(device=dev, rank=rank, world_size=world_size, amp_dtype=amp_dtype, train_amp_dtype=train_amp_dtype)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT stops training (``KeyboardInterrupt``: the last checkpoint stays) even when the process inherited it
    ignored, as a shell script starts a job in the background with ``&``, and Python then keeps it ignored."""
    restore = (
        threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    )
    if restore:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if restore:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


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
