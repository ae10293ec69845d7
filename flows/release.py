"""retrain_and_release: from events in ClickHouse to a registered, lineage-stamped candidate."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from prefect import flow
from pydantic import Field

from relay.settings import get_settings
from tasks.compilation import compile_engines
from tasks.data import DataLimits, read_training_window, validate_training_data, window_ending
from tasks.export import export_onnx
from tasks.lineage import compute_lineage
from tasks.registry import register_candidate
from tasks.summary import ReleaseSummary, publish_release_summary
from tasks.training import TrainConfig, train_ctr_model
from tasks.workdir import run_workdir


@flow(name="retrain-and-release", log_prints=True)
def retrain_and_release(
    window_days: Annotated[float, Field(gt=0, le=90)] = 7.0,
    window_end: datetime | None = None,
    epochs: Annotated[int, Field(ge=1, le=50)] = 2,
    seed: int = 7,
    min_rows: Annotated[int, Field(ge=1)] = 10_000,
    actor: str = "schedule",
) -> ReleaseSummary:
    """Validate the window, train, export, compile with parity, hash lineage, register."""
    settings = get_settings()
    window = window_ending(window_end, window_days)
    workdir = run_workdir(settings)

    frame = read_training_window(settings, window)
    validate_training_data(frame, window, DataLimits(min_rows=min_rows))
    trained = train_ctr_model(frame, TrainConfig(seed=seed, epochs=epochs), workdir)
    model_path = export_onnx(trained, workdir)
    compiled = compile_engines(model_path, trained, workdir)
    lineage = compute_lineage(model_path, frame, compiled.engines, str(window))
    registration = register_candidate(settings, trained, compiled, lineage, workdir, actor)
    return publish_release_summary(registration, trained, compiled, lineage)
