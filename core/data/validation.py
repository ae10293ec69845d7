"""The training window and its validation rules (Great Expectations, ephemeral context).

Pure: a frame and limits in, a report of every expectation out. Reading the window from
ClickHouse and publishing the report as an artifact is `tasks.data`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import pandas as pd
from pydantic import Field

from logstore.events import EVENT_COLUMNS
from relay.features import CATEGORICAL, DENSE, LABEL


@dataclass(frozen=True)
class TrainingWindow:
    """The half-open time range [start, end) the model learns from."""

    start: datetime
    end: datetime

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"

    @classmethod
    def parse(cls, text: str) -> TrainingWindow:
        """The window `str(window)` wrote (as kept in a version's lineage). Raises ValueError."""
        if not (text.startswith("[") and text.endswith(")") and ", " in text):
            raise ValueError(f"not a training window: {text!r}")
        start, end = text[1:-1].split(", ", 1)
        return cls(datetime.fromisoformat(start), datetime.fromisoformat(end))


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result, as a row of the validation artifact."""

    expectation: str
    column: str
    success: bool
    observed: str


@dataclass(frozen=True)
class DataReport:
    """The suite's outcome over a window: every expectation, and whether all passed."""

    rows: int
    outcomes: list[ExpectationOutcome]

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)

    @property
    def failures(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]


@dataclass(frozen=True)
class DataLimits:
    """What a trainable window looks like. The one home of these defaults (the flow reads them)."""

    min_rows: Annotated[int, Field(ge=1)] = 10_000
    min_label_rate: Annotated[float, Field(ge=0, le=1)] = 0.002
    max_label_rate: Annotated[float, Field(ge=0, le=1)] = 0.5


def window_ending(end: datetime | None, days: float) -> TrainingWindow:
    """The `days` before `end` (default: now, UTC)."""
    if days <= 0:
        raise ValueError(f"window_days must be positive, got {days}")
    end = (end or datetime.now(UTC)).astimezone(UTC)
    return TrainingWindow(start=end - timedelta(days=days), end=end)


def build_suite(limits: DataLimits) -> Any:
    """The expectation suite over a training window."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    suite = gx.ExpectationSuite(name="training-window")
    suite.add_expectation(gxe.ExpectTableColumnsToMatchSet(column_set=list(EVENT_COLUMNS)))
    suite.add_expectation(gxe.ExpectTableRowCountToBeBetween(min_value=limits.min_rows))
    for spec in CATEGORICAL:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=spec.name))
        suite.add_expectation(
            gxe.ExpectColumnValuesToBeInTypeList(
                column=spec.name,
                type_list=[
                    "int8",
                    "int16",
                    "int32",
                    "int64",
                    "uint8",
                    "uint16",
                    "uint32",
                    "uint64",
                ],
            )
        )
        if not spec.hashed:
            suite.add_expectation(
                gxe.ExpectColumnValuesToBeBetween(
                    column=spec.name, min_value=0, max_value=spec.buckets
                )
            )
    for dense in DENSE:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=dense.name))
        # inf falls outside any finite range, so this also catches non-finite values
        suite.add_expectation(
            gxe.ExpectColumnValuesToBeBetween(
                column=dense.name, min_value=dense.low, max_value=dense.high
            )
        )
    # Distributions sane: the median price is a real price, history rates are not saturated.
    suite.add_expectation(
        gxe.ExpectColumnMedianToBeBetween(column="price", min_value=0.5, max_value=50_000)
    )
    suite.add_expectation(
        gxe.ExpectColumnMeanToBeBetween(column="user_ctr_30d", min_value=0.0005, max_value=0.5)
    )
    suite.add_expectation(gxe.ExpectColumnStdevToBeBetween(column="item_rating", min_value=0.01))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=LABEL, value_set=[0, 1]))
    suite.add_expectation(
        gxe.ExpectColumnMeanToBeBetween(
            column=LABEL, min_value=limits.min_label_rate, max_value=limits.max_label_rate
        )
    )
    return suite


def _observed(result: dict[str, Any]) -> str:
    if "observed_value" in result:
        return str(result["observed_value"])
    if "unexpected_count" in result:
        sample = result.get("partial_unexpected_list", [])[:3]
        return f"{result['unexpected_count']} unexpected (e.g. {sample})"
    return "n/a"


def validate_frame(frame: pd.DataFrame, limits: DataLimits) -> DataReport:
    """Run the suite over a window; an empty window fails without asking GE."""
    if frame.empty:
        return DataReport(
            rows=0,
            outcomes=[
                ExpectationOutcome("expect_table_row_count_to_be_between", "", False, "0 rows")
            ],
        )
    import great_expectations as gx

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = {"globally": False}  # type: ignore[assignment]
    batch = (
        context.data_sources.add_pandas("relay")
        .add_dataframe_asset("training_window")
        .add_batch_definition_whole_dataframe("whole")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    result = batch.validate(build_suite(limits))
    outcomes = [
        ExpectationOutcome(
            expectation=r.expectation_config.type,
            column=str(r.expectation_config.kwargs.get("column", "")),
            success=bool(r.success),
            observed=_observed(r.result or {})
            if not (r.exception_info or {}).get("raised_exception")
            else f"error: {r.exception_info.get('exception_message')}",
        )
        for r in result.results
    ]
    return DataReport(rows=len(frame), outcomes=outcomes)


def failure_message(report: DataReport, window: TrainingWindow) -> str:
    """The error text: each failed expectation with its observed value."""
    lines = [f"training window {window} failed data validation ({report.rows} rows):"]
    lines += [f"  - {f.expectation}({f.column}): observed {f.observed}" for f in report.failures]
    return "\n".join(lines)


def with_served(events: pd.DataFrame, served: pd.DataFrame) -> pd.DataFrame:
    """Seeded (or production) events and labelled served impressions as one window, by time."""
    if served.empty:
        return events
    if events.empty:
        return served.reset_index(drop=True)
    joined = pd.concat([events, served], ignore_index=True)
    return joined.sort_values("ts", kind="stable", ignore_index=True)
