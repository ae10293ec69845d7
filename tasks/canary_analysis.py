"""The canary gate: canary against its equal-share baseline, judged sequentially window by window.

`judge_window` is the pure core: from the step's cumulative per-user sums (and the latest
window's, for the record) it returns a typed verdict and the evidence carried to the next look.

- Latency: the ratio of geometric-mean latencies canary/baseline, exp(Δ mean log latency), with
  an always-valid confidence sequence (`core.gate.sequential`). A regression counts only when it is
  statistically clear (the interval's low end is above ×1) *and* its estimate exceeds the
  practical tolerance (+`tolerance_pct` % of the baseline's P95 or +`tolerance_ms`, whichever is
  larger, as a ratio). The step passes once the interval's high end is below the tolerance.
- Errors: the difference of 5xx rates, the same way, against `error_tolerance_pt`.
- The absolute SLOs (P95, error rate) apply to the canary as before.
- Clicks: with feedback flowing, the ratio of click-through rates canary/baseline (impressions
  clicked or ordered, clustered by user) over the whole canary so far, every step included,
  with the same kind of always-valid interval. A canary whose clicks are clearly lower (the
  interval's high end below x1) by more than `ctr_tolerance_pct` % fails the step, however fast
  it serves. It is a harm detector, not a pass condition: clicks accrue far more slowly than
  latency samples (one feed is one latency sample and ~1 click), so a step whose latency and
  errors pass is not held back waiting for clicks; its verdict states the click-through interval
  reached, or why clicks were not judged (fewer than `min_impressions` per cohort).
- A per-user Mann-Whitney U test (ClickHouse's `mannWhitneyUTest`) is reported beside it, per
  window and over the step. It is a fixed-sample test: it is shown, never decided on, because
  looking at it after every window would inflate its false alarms.

`tasks.canary_plan` says before the first step how many windows each step should need.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from clickhouse_connect.driver.exceptions import ClickHouseError
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import Field

from core.gate.sequential import (
    METHOD,
    Interval,
    click_through_shift,
    confidence_sequence,
    error_shift,
    latency_shift,
)
from logstore.feedback import ClickSums, query_click_cohorts
from logstore.reading import connect_for_reading
from logstore.release_events import EventKind, events_of_release
from logstore.slo import (
    CohortSums,
    PairedSeconds,
    RankTest,
    query_cohorts,
    query_paired_seconds,
    query_rank_test,
)
from relay.errors import LogStoreError
from relay.settings import Settings
from relay.types import GateResult, Release, Verdict
from serving.fleet import FleetClient
from tasks.canary import record
from tasks.tracing import release_tracer, traced

log = logging.getLogger("relay.canary")

MIN_USERS = 20  # fewer users than this and the per-user variance estimate is itself noise
LOG_STORE_ERRORS = (ClickHouseError, LogStoreError, OSError)  # evidence of nothing: counted
SLOTS = ("canary", "baseline", "stable")


@dataclass(frozen=True)
class CanaryRules:
    """When a canary step passes, fails or needs a person. The one home of these defaults."""

    # The Field bounds are __post_init__'s checks as the run form and the API state them, so a
    # bad value is refused before a flow run exists; __post_init__ still guards direct use.
    max_p95_ms: Annotated[float, Field(gt=0)] = 300.0  # absolute SLOs, on the canary alone
    max_error_rate: Annotated[float, Field(gt=0, le=1)] = 0.01
    # of the always-valid intervals, across every look of a step
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = 0.95
    # practical tolerance: +10 % of the baseline's P95 ...
    tolerance_pct: Annotated[float, Field(ge=0, le=1000)] = 10.0
    tolerance_ms: Annotated[float, Field(ge=0, le=60_000)] = (
        5.0  # ... or +5 ms, whichever is larger
    )
    # errors: +0.5 percentage points over the baseline
    error_tolerance_pt: Annotated[float, Field(ge=0, le=100)] = 0.5
    min_requests: Annotated[int, Field(ge=1)] = 200  # per cohort over the step before any verdict
    # per step; still undecided then -> inconclusive, a person decides
    max_windows: Annotated[int, Field(ge=1, le=100)] = 10
    # failed log queries in a row before `error`
    consecutive_error_limit: Annotated[int, Field(ge=1)] = 4
    # clicks: a canary losing more than 10 % of them fails
    ctr_tolerance_pct: Annotated[float, Field(gt=0, lt=100)] = 10.0
    # per cohort, over the canary so far, before clicks are judged
    min_impressions: Annotated[int, Field(ge=1)] = 2_000
    # what the plan aims for: a canary equal to its baseline passes
    power: Annotated[float, Field(gt=0, lt=1)] = 0.8

    def __post_init__(self) -> None:
        checks = {
            "confidence": 0.5 < self.confidence < 1,
            "tolerance_pct": self.tolerance_pct >= 0,
            "tolerance_ms": self.tolerance_ms >= 0,
            "error_tolerance_pt": self.error_tolerance_pt >= 0,
            "max_windows": self.max_windows >= 1,
            "min_requests": self.min_requests >= 1,
            "max_p95_ms": self.max_p95_ms > 0,
            "max_error_rate": 0 < self.max_error_rate <= 1,
            "consecutive_error_limit": self.consecutive_error_limit >= 1,
            "power": 0 < self.power < 1,
            "ctr_tolerance_pct": 0 < self.ctr_tolerance_pct < 100,
            "min_impressions": self.min_impressions >= 1,
        }
        bad = [f"{name}={getattr(self, name)!r}" for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid canary rules: {', '.join(bad)}")
        if self.tolerance_pct == 0 and self.tolerance_ms == 0:
            raise ValueError("invalid canary rules: tolerance_pct and tolerance_ms are both 0")

    @property
    def alpha(self) -> float:
        return 1 - self.confidence

    def latency_tolerance(self, baseline_p95_ms: float) -> float:
        """The largest canary/baseline latency ratio that is not a regression."""
        relative = self.tolerance_ms / baseline_p95_ms if baseline_p95_ms > 0 else math.inf
        return 1 + max(self.tolerance_pct / 100, relative)

    @property
    def ctr_tolerance(self) -> float:
        """The lowest canary/baseline click-through ratio that is not a loss."""
        return 1 - self.ctr_tolerance_pct / 100

    def thresholds(self) -> dict[str, float]:
        return {
            "max_p95_ms": self.max_p95_ms,
            "max_error_rate": self.max_error_rate,
            "confidence": self.confidence,
            "tolerance_pct": self.tolerance_pct,
            "tolerance_ms": self.tolerance_ms,
            "error_tolerance_pt": self.error_tolerance_pt,
            "min_requests": float(self.min_requests),
            "max_windows": float(self.max_windows),
            "ctr_tolerance_pct": self.ctr_tolerance_pct,
            "min_impressions": float(self.min_impressions),
        }


@dataclass(frozen=True)
class StepFigures:
    """What the log store says about one canary step: over the step so far, and its last window."""

    canary: CohortSums | None
    baseline: CohortSums | None
    paired: PairedSeconds | None = None  # None: treat the cohorts' moments as unrelated
    stable: CohortSums | None = None
    rank: RankTest | None = None
    window_canary: CohortSums | None = None
    window_baseline: CohortSums | None = None
    window_rank: RankTest | None = None
    clicks_canary: ClickSums | None = None  # over the canary so far, all its steps
    clicks_baseline: ClickSums | None = None


@dataclass(frozen=True)
class StepEvidence:
    """What the step has established so far: intervals intersected over looks, running p-values."""

    looks: int = 0
    latency: Interval = field(default_factory=lambda: Interval(-math.inf, math.inf, 1.0))
    errors: Interval = field(default_factory=lambda: Interval(-math.inf, math.inf, 1.0))
    clicks: Interval = field(default_factory=lambda: Interval(-math.inf, math.inf, 1.0))

    def after(
        self, latency: Interval, errors: Interval, clicks: Interval | None = None
    ) -> StepEvidence:
        """Each interval holds at every look at once, so their running intersection does too."""

        def meet(a: Interval, b: Interval) -> Interval:
            return Interval(max(a.low, b.low), min(a.high, b.high), min(a.p_value, b.p_value))

        return StepEvidence(
            self.looks + 1,
            meet(self.latency, latency),
            meet(self.errors, errors),
            self.clicks if clicks is None else meet(self.clicks, clicks),
        )


def _describe(prefix: str, c: CohortSums | None) -> dict[str, float]:
    if c is None:
        return {f"{prefix}_requests": 0.0}
    return {
        f"{prefix}_users": float(c.users),
        f"{prefix}_requests": c.requests,
        f"{prefix}_p50_ms": c.p50_ms,
        f"{prefix}_p95_ms": c.p95_ms,
        f"{prefix}_p99_ms": c.p99_ms,
        f"{prefix}_error_rate": c.errors / c.requests if c.requests else 0.0,
    }


def _measured(figures: StepFigures) -> dict[str, float]:
    measured = _describe("canary", figures.canary) | _describe("baseline", figures.baseline)
    measured |= _describe("stable", figures.stable)
    measured |= {
        f"window_{k}": v
        for k, v in (
            _describe("canary", figures.window_canary)
            | _describe("baseline", figures.window_baseline)
        ).items()
    }
    for name, rank in (("mwu", figures.rank), ("window_mwu", figures.window_rank)):
        if rank is not None:
            measured |= {f"{name}_p": rank.p_value, f"{name}_users": float(rank.users)}
    return measured


def judge_window(
    figures: StepFigures, rules: CanaryRules, evidence: StepEvidence
) -> tuple[GateResult, StepEvidence]:
    """passed | failed | inconclusive after this look, and the evidence carried to the next."""
    canary, baseline = figures.canary, figures.baseline
    measured = _measured(figures) | {"look": float(evidence.looks + 1)}

    def verdict(v: Verdict, reason: str, carried: StepEvidence) -> tuple[GateResult, StepEvidence]:
        gate = GateResult(
            gate="canary",
            verdict=v,
            reason=reason,
            method=METHOD,
            measurements=measured,
            thresholds=rules.thresholds(),
        )
        return gate, carried

    if canary is None or baseline is None:
        missing = " and ".join(
            s for s, c in (("canary", canary), ("baseline", baseline)) if c is None
        )
        return verdict(Verdict.inconclusive, f"no {missing} requests yet", evidence)
    fewest = min(canary.requests, baseline.requests)
    if fewest < rules.min_requests or min(canary.users, baseline.users) < MIN_USERS:
        return verdict(
            Verdict.inconclusive,
            f"canary {canary.requests:.0f} requests from {canary.users} users, baseline "
            f"{baseline.requests:.0f} from {baseline.users}: fewer than the "
            f"{rules.min_requests} requests and {MIN_USERS} users each needed",
            evidence,
        )

    tolerance = rules.latency_tolerance(baseline.p95_ms)
    shift = latency_shift(canary, baseline, figures.paired)
    errors_shift = error_shift(canary, baseline, figures.paired)
    error_tol = rules.error_tolerance_pt / 100
    clicks = _clicks_judged(figures, rules)
    ctr_shift = click_through_shift(*clicks) if clicks is not None else None
    evidence = evidence.after(
        confidence_sequence(shift, math.log(tolerance), rules.alpha),
        confidence_sequence(errors_shift, max(error_tol, 1e-4), rules.alpha),
        None
        if ctr_shift is None
        else confidence_sequence(ctr_shift, 1 - rules.ctr_tolerance, rules.alpha),
    )
    lat, err = evidence.latency, evidence.errors
    ratio = math.exp(shift.value)
    measured |= {
        "latency_ratio": ratio,
        "latency_ratio_low": math.exp(lat.low),
        "latency_ratio_high": math.exp(lat.high) if lat.high < 700 else math.inf,
        "latency_tolerance_ratio": tolerance,
        "latency_p_always_valid": lat.p_value,
        "error_diff": errors_shift.value,
        "error_diff_low": err.low,
        "error_diff_high": err.high,
        "error_p_always_valid": err.p_value,
        "p95_ratio": canary.p95_ms / baseline.p95_ms if baseline.p95_ms > 0 else math.nan,
    }
    pct = f"{rules.confidence:.0%}"
    latency_text = (
        f"canary latency x{ratio:.2f} of baseline's (geometric mean; always-valid {pct} interval "
        f"x{math.exp(lat.low):.2f}-x{math.exp(min(lat.high, 700)):.2f}, p={lat.p_value:.3g}; "
        f"P95 {canary.p95_ms:.1f} vs {baseline.p95_ms:.1f} ms; "
        f"{canary.requests:.0f} vs {baseline.requests:.0f} requests from "
        f"{canary.users} vs {baseline.users} users)"
    )
    tolerance_text = (
        f"tolerance x{tolerance:.2f} (+{rules.tolerance_pct:g} % of baseline P95 or "
        f"+{rules.tolerance_ms:g} ms, whichever is larger)"
    )
    error_text = (
        f"canary errors {_pct(canary.errors, canary.requests)} vs baseline "
        f"{_pct(baseline.errors, baseline.requests)} (difference {errors_shift.value * 100:+.2f} pt, "
        f"interval {err.low * 100:+.2f} to {err.high * 100:+.2f} pt, p={err.p_value:.3g})"
    )

    failures = []
    if canary.p95_ms > rules.max_p95_ms:
        failures.append(
            f"absolute SLO: canary P95 {canary.p95_ms:.1f} ms > {rules.max_p95_ms:g} ms"
        )
    canary_errors = canary.errors / canary.requests
    if canary_errors > rules.max_error_rate:
        failures.append(
            f"absolute SLO: canary error rate {canary_errors:.2%} > {rules.max_error_rate:.2%}"
        )
    if lat.low > 0 and shift.value > math.log(tolerance):
        failures.append(f"relative to baseline: {latency_text}, beyond the {tolerance_text}")
    if err.low > 0 and errors_shift.value > error_tol:
        failures.append(
            f"relative to baseline: {error_text}, beyond the +{rules.error_tolerance_pt:g} pt tolerance"
        )
    if clicks is None or ctr_shift is None:
        measured["ctr_judged"] = 0.0
        clicks_text = _clicks_not_judged(figures, rules)
    else:
        ctr = evidence.clicks
        measured |= {
            "ctr_judged": 1.0,
            "canary_impressions": clicks[0].impressions,
            "baseline_impressions": clicks[1].impressions,
            "canary_ctr": clicks[0].rate,
            "baseline_ctr": clicks[1].rate,
            "ctr_ratio": 1 + ctr_shift.value,
            "ctr_ratio_low": max(1 + ctr.low, 0.0),
            "ctr_ratio_high": 1 + ctr.high,
            "ctr_tolerance_ratio": rules.ctr_tolerance,
            "ctr_p_always_valid": ctr.p_value,
        }
        clicks_text = (
            f"click-through canary {clicks[0].rate:.2%} vs baseline {clicks[1].rate:.2%} "
            f"(x{1 + ctr_shift.value:.2f}; always-valid {pct} interval "
            f"x{max(1 + ctr.low, 0.0):.2f}-x{1 + ctr.high:.2f}, "
            f"p={ctr.p_value:.3g}; {clicks[0].impressions:.0f} vs {clicks[1].impressions:.0f} "
            f"impressions from {clicks[0].users} vs {clicks[1].users} users over the canary so far)"
        )
        if ctr.high < 0 and 1 + ctr_shift.value < rules.ctr_tolerance:
            failures.append(
                f"fewer clicks than baseline: {clicks_text}, beyond the "
                f"-{rules.ctr_tolerance_pct:g} % click-through tolerance"
            )
    if failures:
        return verdict(Verdict.failed, "; ".join(failures), evidence)
    if lat.high < math.log(tolerance) and err.high < error_tol:
        return verdict(
            Verdict.passed,
            f"no regression beyond tolerance: {latency_text}, within the {tolerance_text}; "
            f"{error_text}, within +{rules.error_tolerance_pt:g} pt; {clicks_text}",
            evidence,
        )
    return verdict(
        Verdict.inconclusive,
        f"not yet conclusive after look {evidence.looks} of {rules.max_windows}: {latency_text}, "
        f"{tolerance_text}; {error_text}; {clicks_text}",
        evidence,
    )


def _clicks_judged(figures: StepFigures, rules: CanaryRules) -> tuple[ClickSums, ClickSums] | None:
    """Canary and baseline click sums when both are large enough to judge, else None."""
    c, b = figures.clicks_canary, figures.clicks_baseline
    if c is None or b is None:
        return None
    enough = min(c.impressions, b.impressions) >= rules.min_impressions
    if not enough or min(c.users, b.users) < MIN_USERS or b.clicked == 0:
        return None
    return c, b


def _clicks_not_judged(figures: StepFigures, rules: CanaryRules) -> str:
    c, b = figures.clicks_canary, figures.clicks_baseline
    if c is None and b is None:
        return "clicks not judged: no impressions logged for canary or baseline (feedback off?)"
    counts = ", ".join(
        f"{name} {x.impressions:.0f} impressions from {x.users} users, {x.clicked:.0f} clicked"
        if x is not None
        else f"{name} none"
        for name, x in (("canary", c), ("baseline", b))
    )
    return (
        f"clicks not judged yet: {counts} over the canary so far (needs {rules.min_impressions} "
        f"impressions from {MIN_USERS} users each, and a baseline click)"
    )


def latency_regressed(gate: GateResult) -> bool:
    """Whether a failed canary verdict rests on latency (its P95 SLO or the ratio to baseline)."""
    m, t = gate.measurements, gate.thresholds
    if gate.verdict is not Verdict.failed:
        return False
    over_slo = m.get("canary_p95_ms", 0.0) > t.get("max_p95_ms", math.inf)
    over_baseline = m.get("latency_ratio_low", 0.0) > 1 and m.get("latency_ratio", 0.0) > m.get(
        "latency_tolerance_ratio", math.inf
    )
    return over_slo or over_baseline


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.2%}" if whole else "n/a"


# -- task shells -----------------------------------------------------------------------------


def reader(settings: Settings) -> Any:
    return connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)


def read_step_figures(
    client: Any,
    step_start: datetime,
    start: datetime,
    end: datetime,
    canary: str,
    baseline: str,
    canary_start: datetime | None = None,
) -> StepFigures:
    """Cumulative and last-window figures of one step, and clicks since `canary_start`."""

    def pick(cohorts: list[CohortSums], slot: str, version: str | None) -> CohortSums | None:
        rows = [
            c for c in cohorts if c.slot == slot and (version is None or c.model_version == version)
        ]
        return max(rows, key=lambda c: c.requests) if rows else None

    step = query_cohorts(client, step_start, end, SLOTS)
    clicks = query_click_cohorts(client, canary_start or step_start, end, canary, baseline)
    window = query_cohorts(client, start, end, ("canary", "baseline"))
    return StepFigures(
        canary=pick(step, "canary", canary),
        baseline=pick(step, "baseline", baseline),
        paired=query_paired_seconds(client, step_start, end, canary, baseline),
        stable=pick(step, "stable", None),
        rank=query_rank_test(client, step_start, end, canary, baseline),
        window_canary=pick(window, "canary", canary),
        window_baseline=pick(window, "baseline", baseline),
        window_rank=query_rank_test(client, start, end, canary, baseline),
        clicks_canary=clicks.get("canary"),
        clicks_baseline=clicks.get("baseline"),
    )


def canary_started_at(client: Any, release: Release) -> datetime | None:
    """When this release's canary first took users (its first weight above 0), if it has."""
    for event in events_of_release(client, release.release_id):
        if (
            event.kind == EventKind.weight
            and event.verdict == Verdict.passed
            and event.details.get("weight")
        ):
            return event.ts if event.ts.tzinfo else event.ts.replace(tzinfo=UTC)
    return None


def unreachable_workers(settings: Settings) -> list[str]:
    """URLs of workers that do not answer their admin API."""
    with FleetClient.from_settings(settings) as fleet:
        return [w.url for w in fleet.state().workers if w.status is None]


def _error(reason: str, measured: dict[str, float] | None = None) -> GateResult:
    return GateResult(
        gate="canary", verdict=Verdict.error, reason=reason, measurements=measured or {}
    )


@dataclass(frozen=True)
class StepIO:
    """What a canary step does to the world. The task shell passes real ones; tests pass fakes."""

    run_window: Callable[[], tuple[datetime, datetime]]  # waits out the window; its bounds
    read_figures: Callable[[datetime, datetime, datetime], StepFigures]  # step start, window
    unreachable_workers: Callable[[], list[str]]
    on_look: Callable[[int, GateResult], None] = lambda window, gate: None  # as each look ends


def run_step(io: StepIO, rules: CanaryRules, weight: int) -> list[GateResult]:
    """Every look of one step, in order; the last is the step's verdict.

    Failed log queries count towards `error`; a failure of the analysis itself is `error` at
    once (a bug must never read as 'not enough evidence'); a worker that stops answering is
    `error` (a dead worker logs nothing, so its absence must be checked, not inferred).
    """
    looks: list[GateResult] = []
    consecutive_errors = 0
    evidence = StepEvidence()
    step_start: datetime | None = None
    for window in range(1, rules.max_windows + 1):
        start, end = io.run_window()
        step_start = step_start or start
        try:
            figures = io.read_figures(step_start, start, end)
        except LOG_STORE_ERRORS as exc:  # a failed query is evidence of nothing; count it
            consecutive_errors += 1
            if consecutive_errors >= rules.consecutive_error_limit:
                gate = _error(f"{consecutive_errors} consecutive failed log queries; last: {exc}")
            else:
                gate = GateResult(
                    gate="canary",
                    verdict=Verdict.inconclusive,
                    reason=f"log query failed ({consecutive_errors} in a row): {exc}",
                )
        else:
            consecutive_errors = 0
            try:
                gate, evidence = judge_window(figures, rules, evidence)
            except Exception as exc:  # a bug in the analysis: never 'inconclusive'
                log.exception("canary analysis failed")
                gate = _error(f"the canary analysis itself failed: {type(exc).__name__}: {exc}")
        lost = io.unreachable_workers()
        if lost:
            gate = _error(f"worker(s) unreachable mid-canary: {', '.join(lost)}", gate.measurements)
        if window == rules.max_windows and gate.verdict is Verdict.inconclusive:
            reason = f"still inconclusive after all {rules.max_windows} windows at {weight} %: "
            gate = gate.model_copy(update={"reason": reason + gate.reason})
        looks.append(gate)
        io.on_look(window, gate)
        if gate.verdict is not Verdict.inconclusive:
            break
    return looks


def _table_row(weight: int, window: int, gate: GateResult) -> dict[str, Any]:
    measured = gate.measurements
    return {
        "weight": weight,
        "window": window,
        "verdict": gate.verdict.value,
        **{
            k: round(measured[k], 4)
            for k in _TABLE_COLUMNS
            if k in measured and math.isfinite(measured[k])
        },
        "reason": gate.reason,
    }


@task(name="analyse-canary-step", cache_policy=NO_CACHE)
@traced("canary step")
def analyse_canary_step(
    settings: Settings,
    release: Release,
    baseline_version: str,
    weight: int,
    rules: CanaryRules,
    window_s: float,
) -> GateResult:
    """Look after every window until the step is conclusive or `rules.max_windows` pass.

    Each window: wait while the fleet serves whatever traffic it gets (the shop's, embedded; real
    users', in production), ingest the workers' logs, judge the step's cumulative evidence; every
    look is a release event and a row of the step's table artifact.
    """
    tracer = release_tracer(settings)  # each window (and its lease renewals) in the release's trace

    def run_window() -> tuple[datetime, datetime]:
        # The canary's weight is leased: renewed now, while the window runs and as it ends, so
        # that it lapses on every worker within one lease of this process dying.
        with ExitStack() as renewal:
            renewal.enter_context(tracer.start_as_current_span("analysis window"))
            if weight > 0:
                fleet = renewal.enter_context(FleetClient.from_settings(settings))
                renewal.enter_context(fleet.renewing(settings.serving_canary_lease_s))
            start = datetime.now(UTC)
            time.sleep(window_s)
            end = datetime.now(UTC)
        time.sleep(2 * settings.serving_log_flush_ms / 1000)  # let workers write the window's rows
        return start, end

    canary_start: list[datetime] = []  # found once, at the first look whose query succeeds

    def read_figures(step_start: datetime, start: datetime, end: datetime) -> StepFigures:
        client = reader(settings)
        if not canary_start:  # a failed lookup is a failed log query, counted like the others
            canary_start.append(canary_started_at(client, release) or step_start)
        return read_step_figures(
            client, step_start, start, end, release.version, baseline_version, canary_start[0]
        )

    def on_look(window: int, gate: GateResult) -> None:  # visible while the step still runs
        record(
            settings,
            release,
            EventKind.slo_window,
            gate.verdict,
            gate.reason,
            weight=weight,
            window=window,
            method=gate.method,
            measurements=gate.measurements,
            thresholds=gate.thresholds,
        )

    io = StepIO(run_window, read_figures, lambda: unreachable_workers(settings), on_look)
    looks = run_step(io, rules, weight)
    create_table_artifact(
        key=f"canary-weight-{weight}",
        table=[_table_row(weight, i, g) for i, g in enumerate(looks, 1)],
        description=(
            f"Canary {release.version} vs baseline {baseline_version} at {weight} %: one row per "
            f"look, cumulative over the step. Method: {METHOD}."
        ),
    )
    return looks[-1]


_TABLE_COLUMNS = (
    "canary_requests",
    "baseline_requests",
    "canary_p95_ms",
    "baseline_p95_ms",
    "stable_p95_ms",
    "latency_ratio",
    "latency_ratio_low",
    "latency_ratio_high",
    "latency_tolerance_ratio",
    "latency_p_always_valid",
    "error_diff",
    "ctr_ratio",
    "ctr_ratio_low",
    "ctr_ratio_high",
    "mwu_p",
    "window_mwu_p",
)
