"""Compile ONNX into serving engines and gate each on parity with the PyTorch reference.

Engines: `ort-fp32` (ONNX Runtime offline graph optimisation) and `ort-int8` (dynamic
quantisation of the weights). An engine that misses a tolerance is rejected with its numbers;
if no engine passes, the release stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from core.training.model import TrainedModel, auc
from relay.errors import ParityFailed
from relay.types import ParityResult
from tasks.export import INPUT_NAME


@dataclass(frozen=True)
class ParityTolerance:
    """How far an engine may stray from the PyTorch reference on the holdout."""

    max_abs_diff: float
    max_auc_delta: float
    min_topk_overlap: float
    k: int = 5

    def as_dict(self) -> dict[str, float]:
        return {
            "max_abs_diff": self.max_abs_diff,
            "max_auc_delta": self.max_auc_delta,
            "min_topk_overlap": self.min_topk_overlap,
            "k": self.k,
        }


# fp32 must be numerically the same model; int8 may move scores but must not reorder results.
TOLERANCES: dict[str, ParityTolerance] = {
    "ort-fp32": ParityTolerance(max_abs_diff=1e-5, max_auc_delta=1e-4, min_topk_overlap=0.99),
    "ort-int8": ParityTolerance(max_abs_diff=0.05, max_auc_delta=0.005, min_topk_overlap=0.90),
    # TensorRT FP16 (tasks/tensorrt.py), against ONNX Runtime fp32 on the calibration set: half
    # precision keeps ~3 significant digits, so scores may move a little but rankings must hold.
    "trt-fp16": ParityTolerance(max_abs_diff=0.01, max_auc_delta=0.002, min_topk_overlap=0.95),
}

ORT_OPT_LEVEL = "ORT_ENABLE_EXTENDED"  # portable across CPUs, unlike ENABLE_ALL's layout passes


@dataclass(frozen=True)
class CompiledEngine:
    name: str
    path: Path
    options: dict[str, Any]


def session_options(threads: int = 1) -> ort.SessionOptions:
    """Deterministic CPU options used for parity checks."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return opts


def optimise_fp32(model_path: Path, out: Path) -> CompiledEngine:
    """ONNX Runtime's offline graph optimisation, saved so serving skips it at load."""
    opts = session_options()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ORT_OPT_LEVEL)
    opts.optimized_model_filepath = str(out)
    ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    return CompiledEngine(
        "ort-fp32", out, {"graph_optimization_level": ORT_OPT_LEVEL, "ort": ort.__version__}
    )


def quantise_int8(model_path: Path, out: Path) -> CompiledEngine:
    """Dynamic int8 quantisation of MatMul weights (activations quantised at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(model_path),
        str(out),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Gemm"],
    )
    return CompiledEngine(
        "ort-int8", out, {"quantization": "dynamic", "weight_type": "QInt8", "ort": ort.__version__}
    )


def run_engine(path: Path, x: np.ndarray, batch: int = 8192) -> np.ndarray:
    """Scores from an ONNX Runtime session over x, in batches."""
    session = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
    out = np.empty(len(x), dtype=np.float32)
    for start in range(0, len(x), batch):
        out[start : start + batch] = session.run(None, {INPUT_NAME: x[start : start + batch]})[0]
    return out


def topk_overlap(reference: np.ndarray, candidate: np.ndarray, groups: np.ndarray, k: int) -> float:
    """Mean |top-k(reference) ∩ top-k(candidate)| / k over requests with more than k candidates."""
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    bounds = np.flatnonzero(np.diff(g)) + 1
    overlaps = []
    for idx in np.split(order, bounds):
        if len(idx) <= k:
            continue
        top_ref = set(idx[np.argsort(-reference[idx], kind="stable")[:k]])
        top_new = set(idx[np.argsort(-candidate[idx], kind="stable")[:k]])
        overlaps.append(len(top_ref & top_new) / k)
    return float(np.mean(overlaps)) if overlaps else 1.0


def assess_parity(
    engine: str,
    reference: np.ndarray,
    candidate: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
    tolerance: ParityTolerance,
) -> ParityResult:
    """Accept an engine only if scores, AUC and per-request top-k all stay within tolerance."""
    if not np.isfinite(candidate).all():
        max_abs, auc_delta, overlap = float("inf"), float("inf"), 0.0
    else:
        max_abs = float(np.max(np.abs(candidate.astype(np.float64) - reference)))
        auc_delta = abs(auc(labels, candidate) - auc(labels, reference))
        overlap = topk_overlap(reference, candidate, groups, tolerance.k)
    problems = []
    if not max_abs <= tolerance.max_abs_diff:
        problems.append(f"max |Δscore| {max_abs:.3g} > {tolerance.max_abs_diff:g}")
    if not auc_delta <= tolerance.max_auc_delta:
        problems.append(f"|ΔAUC| {auc_delta:.3g} > {tolerance.max_auc_delta:g}")
    if not overlap >= tolerance.min_topk_overlap:
        problems.append(f"top-{tolerance.k} overlap {overlap:.3f} < {tolerance.min_topk_overlap:g}")
    return ParityResult(
        engine=engine,
        accepted=not problems,
        reason="; ".join(problems) if problems else "within tolerance",
        max_abs_diff=max_abs,
        auc_delta=auc_delta,
        topk_overlap=overlap,
        tolerances=tolerance.as_dict(),
    )


@dataclass
class CompileOutcome:
    """Engines that passed parity (in preference order) and every parity result."""

    engines: list[CompiledEngine]
    parity: list[ParityResult]


def build_failed(engine: str, exc: Exception) -> ParityResult:
    """A parity row for an engine that could not even be built (e.g. quantising NaN weights)."""
    return ParityResult(
        engine=engine,
        accepted=False,
        reason=f"build failed: {type(exc).__name__}: {exc}",
        max_abs_diff=float("inf"),
        auc_delta=float("inf"),
        topk_overlap=0.0,
        tolerances=TOLERANCES[engine].as_dict(),
    )


@task(name="compile-engines", cache_policy=NO_CACHE)
def compile_engines(model_path: Path, trained: TrainedModel, workdir: Path) -> CompileOutcome:
    """Build every engine, check parity on the holdout, keep the ones that pass."""
    builders = [
        ("ort-fp32", lambda: optimise_fp32(model_path, workdir / "ort-fp32.onnx")),
        ("ort-int8", lambda: quantise_int8(model_path, workdir / "ort-int8.onnx")),
    ]
    accepted: list[CompiledEngine] = []
    results: list[ParityResult] = []
    for name, build in builders:
        try:
            engine = build()
        except Exception as exc:  # a failed build rejects this engine; the numbers say why
            results.append(build_failed(name, exc))
            continue
        result = assess_parity(
            engine.name,
            trained.reference_scores,
            run_engine(engine.path, trained.holdout_x),
            trained.holdout_y,
            trained.holdout_groups,
            TOLERANCES[engine.name],
        )
        results.append(result)
        if result.accepted:
            accepted.append(engine)
    create_table_artifact(
        key="parity",
        table=[r.model_dump() for r in results],
        description="Parity of each compiled engine against the PyTorch reference on the holdout",
    )
    if not any(e.name == "ort-fp32" for e in accepted):
        raise ParityFailed(
            "the fp32 engine does not reproduce the PyTorch model: "
            + "; ".join(f"{r.engine}: {r.reason}" for r in results)
        )
    return CompileOutcome(engines=accepted, parity=results)
