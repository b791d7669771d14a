"""GPU assignment for ``dynamo serve``: ``resources.gpu`` per process, given to each
process through ``CUDA_VISIBLE_DEVICES``.

Whole numbers take that many GPUs nobody uses yet, lowest index first. A fraction below
1 shares a GPU with other fractional processes while their sum stays within one GPU.
Asking for more than the machine has is an error unless allocation is disabled.
"""

from __future__ import annotations

import os
import shutil
import subprocess

#: Set (to anything) to start processes without assigning GPUs.
DISABLE_ENV = "DYN_DISABLE_AUTO_GPU_ALLOCATION"
#: Overrides the number of GPUs detected (tests, or machines without nvidia-smi).
COUNT_ENV = "DYN_SDK_GPU_COUNT"


class GpuAllocationError(RuntimeError):
    """The graph asks for GPUs the machine does not have."""


def allocation_disabled() -> bool:
    return bool(os.environ.get(DISABLE_ENV))


def detect_gpu_count() -> int:
    """GPUs on this machine: ``DYN_SDK_GPU_COUNT`` if set, else ``nvidia-smi --list-gpus``, else 0."""
    override = os.environ.get(COUNT_ENV)
    if override is not None:
        try:
            return int(override)
        except ValueError:
            raise GpuAllocationError(f"{COUNT_ENV} must be an integer, got {override!r}") from None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "--list-gpus"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


class GpuAllocator:
    """Hands out GPU indices to processes, in the order they are asked for."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = [0.0] * total

    def assign(self, who: str, amount: float) -> list[int]:
        """GPU indices for one process of ``who`` asking for ``amount`` GPUs."""
        if amount <= 0:
            return []
        if amount < 1:
            shared = [i for i in range(self.total) if self.used[i] > 0 and self.used[i] + amount <= 1 + 1e-9]
            free = [i for i in range(self.total) if self.used[i] == 0]
            candidates = shared or free
            if not candidates:
                raise GpuAllocationError(self._shortage(who, amount))
            self.used[candidates[0]] += amount
            return [candidates[0]]
        if amount != int(amount):
            raise GpuAllocationError(f"{who}: resources.gpu must be a whole number or a fraction below 1, got {amount}")
        free = [i for i in range(self.total) if self.used[i] == 0][: int(amount)]
        if len(free) < int(amount):
            raise GpuAllocationError(self._shortage(who, amount))
        for i in free:
            self.used[i] = 1.0
        return free

    def _shortage(self, who: str, amount: float) -> str:
        in_use = sum(1 for u in self.used if u > 0)
        return (
            f"{who} asks for {amount:g} GPU(s) per process but this machine has {self.total} GPU(s) "
            f"and {in_use} are already assigned; lower resources.gpu or workers, or set "
            f"{DISABLE_ENV}=1 to start without assigning GPUs"
        )
