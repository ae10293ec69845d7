"""GPU check: build the TensorRT plan, check parity, and time it against ONNX Runtime.

    python -m bench.gpu_check [--events 60000] [--batches 1,64,256,1024,4096] [--seconds 1.0]
                              [--ort-threads N]

One script for a GPU host (`pip install -e '.[gpu]'` with a CUDA build of torch), a few minutes
end to end: trains the CTR model on simulated events (CPU, one epoch), exports ONNX, builds the
`ort-fp32` engine and, through the same code as the `compile-tensorrt` flow, the TensorRT FP16
plan for this GPU, gated on parity with ONNX Runtime fp32 over the holdout. Then times both
engines through the serving worker's own engine classes at each batch size: wall time per call
as the batcher sees it (host -> device copy, plan, device -> host copy, synchronised), median and
P95 over as many calls as fit in --seconds (at least 20). ONNX Runtime uses its CUDA provider
when the installed onnxruntime has one, else the CPU.

Without CUDA or tensorrt it still runs: the JSON says TensorRT was skipped and why, and carries
the ONNX Runtime figures. Prints the JSON and writes bench/results/gpu_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench.saved import save

RESULTS = Path(__file__).parent / "results"


def time_engine(engine: Any, x: np.ndarray, batch: int, seconds: float) -> dict[str, float]:
    """Median and P95 wall milliseconds of engine.run on `batch` rows, and rows per second."""
    rows = x[np.arange(batch) % len(x)]
    for _ in range(5):  # warm: first calls pick kernels and fill allocator caches
        engine.run(rows)
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < 20 or time.perf_counter() < deadline:
        started = time.perf_counter()
        engine.run(rows)
        samples.append((time.perf_counter() - started) * 1000)
        if len(samples) >= 100_000:
            break
    samples.sort()
    p50 = statistics.median(samples)
    return {
        "calls": len(samples),
        "p50_ms": round(p50, 4),
        "p95_ms": round(samples[int(0.95 * (len(samples) - 1))], 4),
        "rows_per_s": round(batch / (p50 / 1000), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--batches", default="1,64,256,1024,4096")
    parser.add_argument("--seconds", type=float, default=1.0, help="timing per engine and batch")
    parser.add_argument(
        "--ort-threads", type=int, default=os.cpu_count() or 1, help="ONNX Runtime intra-op threads"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    started = time.perf_counter()

    from relay.gpu import probe_gpu
    from serving.engine import OrtEngine
    from simulation.shop import ShopConfig, generate_events
    from tasks.compilation import optimise_fp32
    from tasks.export import export_model
    from tasks.tensorrt import BatchProfile, TensorRtBuildOptions, build_and_check, skipped
    from tasks.training import TrainConfig, train_model

    work = Path(tempfile.mkdtemp(prefix="relay-gpu-check-"))
    frame = generate_events(ShopConfig(seed=3), args.events, datetime(2026, 11, 1, tzinfo=UTC))
    trained = train_model(frame, TrainConfig(seed=3, epochs=1))
    model_path = export_model(trained.model, work / "model.onnx")
    ort_fp32 = optimise_fp32(model_path, work / "ort-fp32.onnx")
    train_s = time.perf_counter() - started

    probe = probe_gpu()
    options = TensorRtBuildOptions(profile=BatchProfile(max_batch=max(4096, *batches)))
    build_started = time.perf_counter()
    if probe.target is None:
        build = skipped(probe.reason)
    else:
        import tensorrt as trt

        build = build_and_check(
            trt,
            model_path,
            trained.holdout_x,
            trained.holdout_y,
            trained.holdout_groups,
            work,
            probe.target,
            options,
        )
    build_s = time.perf_counter() - build_started

    providers = ort.get_available_providers()
    ort_providers = (
        ["CUDAExecutionProvider", "CPUExecutionProvider"]
        if "CUDAExecutionProvider" in providers
        else ["CPUExecutionProvider"]
    )
    threads = args.ort_threads
    engines: dict[str, Any] = {
        "ort-fp32": OrtEngine("ort-fp32", ort_fp32.path, threads, ort_providers)
    }
    if build.engine is not None:  # time a rejected plan too: the numbers say what it would cost
        from serving.tensorrt_engine import TensorRtPlanEngine

        engines["trt-fp16"] = TensorRtPlanEngine("trt-fp16", build.engine.path)
    x = trained.holdout_x
    latency = {
        name: {str(b): time_engine(engine, x, b, args.seconds) for b in batches}
        for name, engine in engines.items()
    }
    for engine in engines.values():
        engine.close()

    figures: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "gpu": probe.target.model_dump() if probe.target else None,
        },
        "model": {
            "events": args.events,
            "holdout_rows": len(x),
            "holdout_auc": round(trained.metrics["holdout_auc"], 4),
        },
        "tensorrt": {
            **build.summary(),
            "build_and_parity_s": round(build_s, 2),
            "profile": options.profile.model_dump(),
        },
        "onnxruntime": {
            "version": ort.__version__,
            "providers": ort_providers,
            "intra_op_threads": threads,
        },
        "latency": latency,
        "timing": "wall ms per engine.run call incl. host<->device copies; median and P95",
        "train_export_s": round(train_s, 2),
        "total_s": round(time.perf_counter() - started, 2),
    }
    if "trt-fp16" in latency:
        figures["trt_speedup_p50"] = {
            b: round(latency["ort-fp32"][b]["p50_ms"] / latency["trt-fp16"][b]["p50_ms"], 2)
            for b in latency["trt-fp16"]
        }
    save(args.out, figures)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
