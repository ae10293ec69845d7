"""TensorRT plans in the serving worker: find the plan built for this host's GPU, run it.

Plans are built per GPU model after a version is published and filed beside the version
(model_store/plans.py), not in its manifest. `load_local_plan` is the hook that
`serving.loading.load_model` tries first: it returns a warmed `LoadedModel` on the plan when
tensorrt imports, a CUDA device is present and an accepted plan for exactly this GPU and
TensorRT version exists; otherwise None, and the version's ONNX Runtime engine is loaded. A
plan that fails to load or warm up also falls back to ONNX Runtime (logged): the plan is an
optimisation, the ONNX engine is the release.

`TensorRtPlanEngine` has the interface of `serving.engine.OrtEngine` (name, run, close); the
release's parity check (tasks/tensorrt.py) scores through it too, so what was checked is what serves.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from model_store import ModelStore
from model_store.plans import load_plan_record
from relay.errors import ServingError
from relay.gpu import GpuTarget, probe_gpu, tensorrt_installed
from relay.types import EngineRecord, VersionManifest
from serving.engine import LoadedModel, fetch_engine_file, warmed

log = logging.getLogger("serving.tensorrt")


def plan_io(engine: Any, trt: Any) -> tuple[str, str]:
    """The plan's one input and one output tensor names. Raises ServingError otherwise."""
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if n not in inputs]
    if len(inputs) != 1 or len(outputs) != 1:
        raise ServingError(f"TensorRT plan has inputs {inputs} and outputs {outputs}, not one each")
    for name in names:
        if engine.get_tensor_dtype(name) != trt.DataType.FLOAT:
            raise ServingError(
                f"TensorRT plan tensor {name} is {engine.get_tensor_dtype(name)}, not float32"
            )
    return inputs[0], outputs[0]


class TensorRtPlanEngine:
    """A TensorRT plan on this host's GPU, one batch at a time on its own CUDA stream.

    Device and pinned host buffers are sized once for the profile's largest batch, so a batch
    allocates nothing; a batch larger than the profile allows is run in profile-sized chunks.
    """

    def __init__(self, name: str, path: Path) -> None:
        import tensorrt as trt
        import torch

        self.name = name
        self._torch = torch
        self._logger = trt.Logger(trt.Logger.WARNING)  # outlives the runtime that reports to it
        self._runtime = trt.Runtime(self._logger)
        engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise ServingError(
                f"TensorRT could not deserialise {path.name}: built for another GPU or TensorRT?"
            )
        self._engine = engine
        self._input, self._output = plan_io(engine, trt)
        _, _, max_shape = engine.get_tensor_profile_shape(self._input, 0)
        self._max_rows, self._features = int(max_shape[0]), int(max_shape[1])
        self._context = engine.create_execution_context()
        self._stream = torch.cuda.Stream()
        shape = (self._max_rows, self._features)
        self._device_in = torch.empty(shape, dtype=torch.float32, device="cuda")
        self._device_out = torch.empty((self._max_rows,), dtype=torch.float32, device="cuda")
        self._host_in = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        self._host_out = torch.empty((self._max_rows,), dtype=torch.float32, pin_memory=True)
        # The buffers never move, so their addresses are bound once.
        self._context.set_tensor_address(self._input, self._device_in.data_ptr())
        self._context.set_tensor_address(self._output, self._device_out.data_ptr())

    @property
    def max_rows(self) -> int:
        return self._max_rows

    def run(self, x: np.ndarray) -> np.ndarray:
        if self._context is None:
            raise ServingError(f"engine {self.name} was unloaded")
        if x.ndim != 2 or x.shape[1] != self._features:
            raise ServingError(
                f"engine {self.name} takes (n, {self._features}) rows, got {x.shape}"
            )
        x = np.ascontiguousarray(x, dtype=np.float32)
        scores = np.empty(len(x), dtype=np.float32)
        for start in range(0, len(x), self._max_rows):
            rows = min(self._max_rows, len(x) - start)
            scores[start : start + rows] = self._run_chunk(x[start : start + rows], rows)
        return scores

    def _run_chunk(self, chunk: np.ndarray, rows: int) -> np.ndarray:
        torch = self._torch
        self._host_in[:rows].numpy()[...] = chunk  # into pinned memory: the copy up is async
        with torch.cuda.stream(self._stream):  # copies and the plan share one ordered stream
            self._device_in[:rows].copy_(self._host_in[:rows], non_blocking=True)
            if not self._context.set_input_shape(self._input, (rows, self._features)):
                raise ServingError(f"engine {self.name} refused a batch of {rows} rows")
            if not self._context.execute_async_v3(self._stream.cuda_stream):
                raise ServingError(f"TensorRT engine {self.name} failed on a batch of {rows} rows")
            self._host_out[:rows].copy_(self._device_out[:rows], non_blocking=True)
        self._stream.synchronize()
        return self._host_out[:rows].numpy().copy()

    def close(self) -> None:
        # Context before engine before runtime: TensorRT frees them in that order.
        self._context = None
        self._engine = None


@lru_cache(maxsize=1)
def local_gpu() -> GpuTarget | None:
    """This host's GPU target, probed once; None without tensorrt (no torch import then) or CUDA."""
    if not tensorrt_installed():
        return None
    probe = probe_gpu()
    if probe.target is None:
        log.info("no TensorRT plans on this worker: %s", probe.reason)
    return probe.target


def find_local_plan(store: ModelStore, version: str, gpu: GpuTarget) -> EngineRecord | None:
    """The accepted plan of a version built for exactly this GPU and TensorRT, if there is one."""
    record = load_plan_record(store, version, gpu.key)
    if record is None or not record.accepted:
        return None
    return record.engine


def load_local_plan(
    store: ModelStore,
    manifest: VersionManifest,
    ref: str,
    cache_dir: Path,
    *,
    max_batch_rows: int,
) -> LoadedModel | None:
    """The version loaded and warmed on this GPU's plan, or None to load ONNX Runtime instead."""
    gpu = local_gpu()
    if gpu is None:
        return None
    record = find_local_plan(store, manifest.version, gpu)
    if record is None:
        return None
    try:
        engine = TensorRtPlanEngine(record.name, fetch_engine_file(store, record, cache_dir))
    except Exception as exc:  # fall back to ONNX Runtime, and say why
        _not_used(record, manifest, gpu, exc)
        return None
    try:
        return warmed(engine, manifest, record, ref, max_batch_rows)  # closes it on failure
    except Exception as exc:
        _not_used(record, manifest, gpu, exc)
        return None


def _not_used(
    record: EngineRecord, manifest: VersionManifest, gpu: GpuTarget, exc: Exception
) -> None:
    log.warning(
        "TensorRT plan %s of %s for %s not used, loading ONNX Runtime instead: %s: %s",
        record.blob.sha256[:12],
        manifest.version,
        gpu.key,
        type(exc).__name__,
        exc,
    )
