"""Which GPU this host offers TensorRT, named the same way by the plan builder and the server.

A TensorRT plan runs only on the GPU model and TensorRT version that built it, so the builder
(tasks/tensorrt.py, on the `gpu` work pool) files each plan under a key of both, and a serving
worker looks up the key of its own GPU. Both call `probe_gpu`, so the two cannot disagree.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

from pydantic import BaseModel

SUPPORTED_TENSORRT_MAJOR = 10  # TensorRT 11 removed the weakly typed FP16 flag the build uses

NO_CUDA = "skipped: no CUDA device"
NO_TENSORRT = "skipped: tensorrt not installed"


class GpuTarget(BaseModel, frozen=True):
    """The GPU and TensorRT a plan is built for; `key` names the plan in the model store."""

    name: str  # as the driver reports it, e.g. "NVIDIA H200"
    compute_capability: str  # "9.0"
    tensorrt: str  # "10.13.3.9"
    cuda: str | None = None  # the CUDA runtime torch was built with, e.g. "12.8"

    @property
    def key(self) -> str:
        """e.g. `nvidia-h200-sm90-trt10.13.3.9`: safe as one path segment of a store key."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or "gpu"
        sm = self.compute_capability.replace(".", "")
        return f"{slug}-sm{sm}-trt{self.tensorrt}"


@dataclass(frozen=True)
class GpuProbe:
    """The GPU target, or why this host builds and serves no TensorRT plan (a reason, not an error)."""

    target: GpuTarget | None
    reason: str

    @property
    def available(self) -> bool:
        return self.target is not None


def tensorrt_installed() -> bool:
    """Whether `import tensorrt` could work, without paying for the import (or torch's)."""
    return importlib.util.find_spec("tensorrt") is not None


def unsupported_tensorrt(version: str) -> str | None:
    """Why this TensorRT version cannot build our plans, or None when it can."""
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != SUPPORTED_TENSORRT_MAJOR:
        return (
            f"skipped: tensorrt {version} is not {SUPPORTED_TENSORRT_MAJOR}.x (the gpu extra pins "
            f"tensorrt>={SUPPORTED_TENSORRT_MAJOR},<{SUPPORTED_TENSORRT_MAJOR + 1}: TensorRT 11 "
            "dropped the FP16 builder flag for strongly typed networks)"
        )
    return None


def probe_gpu() -> GpuProbe:
    """This host's CUDA device and TensorRT, or the reason there is none: no CUDA device first."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return GpuProbe(None, f"{NO_CUDA} (torch is not installed)")
    if not torch.cuda.is_available():
        detail = "" if torch.version.cuda else f" (torch {torch.__version__} is a CPU build)"
        return GpuProbe(None, NO_CUDA + detail)
    if not tensorrt_installed():
        return GpuProbe(None, f"{NO_TENSORRT} (install the `gpu` extra: pip install 'relay[gpu]')")
    import tensorrt as trt

    version = str(trt.__version__)
    unsupported = unsupported_tensorrt(version)
    if unsupported:
        return GpuProbe(None, unsupported)
    device = torch.cuda.current_device()  # CUDA_VISIBLE_DEVICES pins a worker to one device
    major, minor = torch.cuda.get_device_capability(device)
    target = GpuTarget(
        name=torch.cuda.get_device_name(device),
        compute_capability=f"{major}.{minor}",
        tensorrt=version,
        cuda=torch.version.cuda,
    )
    return GpuProbe(target, f"TensorRT {version} on {target.name} (sm {target.compute_capability})")
