"""One canary step, look after look, until it is conclusive or its planned windows run out.

The step's length and kind come from the plan (`core.gate.plan`): a *full* step must show "no
regression beyond tolerance" (mean, P95, errors) to pass; a *guard* step, where the traffic at
its weight is too thin to show that in time, passes once its planned windows end without a
failure, an error or an invalid split. It exists to stop gross harm while few users see the
canary; the last step is always full, so no release is promoted on a guard step's word.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from core.gate.evidence import StepEvidence, StepFigures
from core.gate.judge import judge_window
from core.gate.rules import CanaryRules
from relay.errors import LogStoreError
from relay.types import GateResult, Verdict

log = logging.getLogger("relay.canary")


@dataclass(frozen=True)
class StepLength:
    """How many windows a step may look, and whether it is a guard step (see the module)."""

    windows: int
    guard: bool = False


@dataclass(frozen=True)
class StepIO:
    """What a canary step does to the world. The task shell passes real ones; tests pass fakes."""

    run_window: Callable[[], tuple[datetime, datetime]]  # waits out the window; its bounds
    read_figures: Callable[[datetime, datetime, datetime], StepFigures]  # step start, window
    unreachable_workers: Callable[[], list[str]]
    on_look: Callable[[int, GateResult], None] = lambda window, gate: None  # as each look ends
    query_errors: tuple[type[BaseException], ...] = (LogStoreError, OSError)  # counted, not bugs


def error_verdict(reason: str, measured: dict[str, float] | None = None) -> GateResult:
    return GateResult(
        gate="canary", verdict=Verdict.error, reason=reason, measurements=measured or {}
    )


def _look(
    io: StepIO, figures_at: tuple[datetime, datetime, datetime], rules: CanaryRules, state: dict
) -> GateResult:
    """One look: read, judge; a failed query counts towards `error`, a bug is `error` at once."""
    try:
        figures = io.read_figures(*figures_at)
    except io.query_errors as exc:  # a failed query is evidence of nothing; count it
        state["errors"] += 1
        state["judged"] = False
        if state["errors"] >= rules.consecutive_error_limit:
            return error_verdict(f"{state['errors']} consecutive failed log queries; last: {exc}")
        return GateResult(
            gate="canary",
            verdict=Verdict.inconclusive,
            reason=f"log query failed ({state['errors']} in a row): {exc}",
        )
    state["errors"] = 0
    looks_before = state["evidence"].looks
    try:
        gate, state["evidence"] = judge_window(figures, rules, state["evidence"], state["weight"])
        state["judged"] = state["evidence"].looks > looks_before  # enough rows to compare
    except Exception as exc:  # a bug in the analysis: never 'inconclusive'
        log.exception("canary analysis failed")
        return error_verdict(f"the canary analysis itself failed: {type(exc).__name__}: {exc}")
    return gate


def _at_the_end(gate: GateResult, length: StepLength, weight: int, judged: bool) -> GateResult:
    """The last planned look's verdict: a guard step that saw no harm passes; others say so.

    A guard step passes only on a look that compared canary and baseline: a failed query or
    too few requests at its end is no evidence of safety.
    """
    if gate.verdict is not Verdict.inconclusive:
        return gate
    if length.guard and judged:
        reason = (
            f"guard step at {weight} % passed: no failure, error or split mismatch in its "
            f"{length.windows} planned windows (too little traffic at this weight to show "
            "equivalence in time; the last step must show it): "
        )
        return gate.model_copy(update={"verdict": Verdict.passed, "reason": reason + gate.reason})
    reason = f"still inconclusive after all {length.windows} windows at {weight} %: "
    return gate.model_copy(update={"reason": reason + gate.reason})


def run_step(
    io: StepIO, rules: CanaryRules, weight: int, length: StepLength | None = None
) -> list[GateResult]:
    """Every look of one step, in order; the last is the step's verdict.

    Without a `length` the step is full and may look `rules.max_windows` times. A worker that
    stops answering is `error` (a dead worker logs nothing, so its absence must be checked).
    """
    length = length or StepLength(rules.max_windows)
    looks: list[GateResult] = []
    state: dict = {"errors": 0, "evidence": StepEvidence(), "weight": weight, "judged": False}
    step_start: datetime | None = None
    for window in range(1, length.windows + 1):
        start, end = io.run_window()
        step_start = step_start or start
        gate = _look(io, (step_start, start, end), rules, state)
        lost = io.unreachable_workers()
        if lost:
            gate = error_verdict(
                f"worker(s) unreachable mid-canary: {', '.join(lost)}", gate.measurements
            )
        if window == length.windows:
            gate = _at_the_end(gate, length, weight, state["judged"])
        looks.append(gate)
        io.on_look(window, gate)
        if gate.verdict is not Verdict.inconclusive:
            break
    return looks
