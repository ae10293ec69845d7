"""Why latency rose: DoWhy's distribution-change attribution over a causal graph of a request.

A latency regression found by the canary gate (canary vs its baseline) or the guard (the champion
before vs now) is attributed to its causes. Each answered request's row is one draw of

    rows -> input_bytes;  rows, input_bytes -> preprocess;  rows, batch_size -> compute;
    rows -> queue;  rows -> postprocess;  queue, preprocess, compute, postprocess -> latency

and `dowhy.gcm.distribution_change_of_graphs` fits that graph's mechanisms (linear additive-noise
models; empirical distributions at the roots) on each population and splits the change in mean
latency into Shapley contributions, one per node whose mechanism changed: a slower model shows
as compute's mechanism, a slower feature pipeline as preprocess's, queueing from smaller
batches as queue's, heavier requests as the rows distribution itself (their extra compute and
preprocess follow from the unchanged mechanisms). Batch size is deliberately not a parent of
queue: under load a long queue makes big batches as much as big batches make a queue, and with
that edge the two split a queueing regression into wild, offsetting shares. Uncertainty: a percentile bootstrap that
resamples both populations' rows and repeats the attribution, as often as the time budget
allows. When the top two causes' intervals overlap the data cannot separate them, and the
statement says so instead of naming one.

Cheap by construction: at most `max_rows` rows per population, sampled uniformly in ClickHouse,
and a time budget for the bootstrap. It reads the log store only after the decision it explains,
so it never delays a rollback (the task shells run it after the weight is 0).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd
from dowhy import gcm
from dowhy.gcm.shapley import ShapleyApproximationMethods, ShapleyConfig
from prefect import task
from prefect.cache_policies import NO_CACHE

from logstore.reading import connect_for_reading
from logstore.release_events import EventKind
from logstore.stage_samples import STAGE_COLUMNS, StageSample, sample_stage_rows
from relay.settings import Settings
from relay.types import GateResult, Release, Verdict
from tasks.canary import canary_period, record
from tasks.canary_analysis import LOG_STORE_ERRORS, latency_regressed

log = logging.getLogger("relay.attribution")

TARGET = "latency_ms"
# (slot, version, start, end) -> a sample of that population's answered requests
Reader = Callable[[str, str, datetime, datetime], StageSample]
CAUSAL_EDGES = (
    ("rows", "input_bytes"),
    ("rows", "preprocess_ms"),
    ("input_bytes", "preprocess_ms"),
    ("rows", "compute_ms"),
    ("batch_size", "compute_ms"),
    ("rows", "queue_ms"),  # a heavier request waits behind more of its own rows' work
    ("rows", "postprocess_ms"),  # one score per row to encode and send
    ("queue_ms", TARGET),
    ("preprocess_ms", TARGET),
    ("compute_ms", TARGET),
    ("postprocess_ms", TARGET),
)
CAUSES = {  # node -> what a person calls it
    "rows": "request size (rows)",
    "input_bytes": "input bytes",
    "batch_size": "batch size",
    "queue_ms": "queue",
    "preprocess_ms": "preprocess",
    "compute_ms": "compute",
    "postprocess_ms": "postprocess",
    TARGET: "unexplained",  # latency beyond the sum of its stages
}
METHOD = (
    "DoWhy gcm distribution-change attribution (Budhathoki et al. 2021): Shapley contributions "
    "of each node's mechanism to the change in mean latency, over the graph rows/input bytes/"
    "batch size -> queue/preprocess/compute/postprocess -> latency (linear additive-noise "
    "mechanisms, empirical root distributions), percentile bootstrap over resampled rows"
)


class AttributionStatus(StrEnum):
    attributed = "attributed"  # a top cause stands out
    cannot_separate = "cannot_separate"  # the top causes' intervals overlap
    no_change = "no_change"  # the latency change's own interval includes 0
    too_few_rows = "too_few_rows"
    failed = "failed"  # the analysis raised; the verdict it explains stands


@dataclass(frozen=True)
class AttributionConfig:
    """How much data and time one attribution may use. The one home of these defaults."""

    max_rows: int = 5_000  # per population, sampled uniformly from the window
    min_rows: int = 200  # per population, below which nothing is attributed
    min_change_ms: float = 0.5  # a smaller change in mean latency is no change to explain
    resamples: int = 30  # bootstrap resamples at most ...
    min_resamples: int = 5  # ... and at least, for an interval to be stated
    budget_s: float = 8.0  # wall time for the whole attribution, bootstrap included
    confidence: float = 0.9
    shapley_samples: int = 500  # draws per evaluated subset of changed mechanisms
    shapley_permutations: int = 3  # random orderings of the eight causes per estimate
    seed: int = 0


@dataclass(frozen=True)
class Contribution:
    """One cause's part of the latency change: milliseconds, and its share with an interval."""

    cause: str  # a key of CAUSES
    ms: float
    share: float  # of the total change (the contributions sum to it)
    share_low: float = math.nan
    share_high: float = math.nan

    @property
    def name(self) -> str:
        return CAUSES[self.cause]


@dataclass(frozen=True)
class LatencyAttribution:
    """The change in latency between two populations, split into its causes, with its evidence."""

    status: AttributionStatus
    statement: str
    change_ms: float = math.nan  # mean latency, after minus before
    change_low_ms: float = math.nan
    change_high_ms: float = math.nan
    p95_change_ms: float = math.nan
    contributions: tuple[Contribution, ...] = ()  # largest first
    rows_before: int = 0
    rows_after: int = 0
    population_before: int = 0
    population_after: int = 0
    resamples: int = 0
    seconds: float = 0.0
    method: str = METHOD
    config: AttributionConfig = field(default_factory=AttributionConfig)

    @property
    def top_cause(self) -> str | None:
        """The cause that stands out, None when none does (or nothing was attributed)."""
        if self.status is not AttributionStatus.attributed or not self.contributions:
            return None
        return self.contributions[0].cause

    def measurements(self) -> dict[str, float]:
        """Flat figures for a verdict's measurements: the change and each cause's share."""
        out = {
            "attribution_change_ms": self.change_ms,
            "attribution_p95_change_ms": self.p95_change_ms,
            "attribution_resamples": float(self.resamples),
            "attribution_seconds": self.seconds,
        }
        for c in self.contributions:
            out[f"attribution_{c.cause}_share"] = c.share
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for release events and artifacts."""
        return {
            "status": self.status.value,
            "statement": self.statement,
            "top_cause": self.top_cause,
            "change_ms": _finite(self.change_ms),
            "change_interval_ms": [_finite(self.change_low_ms), _finite(self.change_high_ms)],
            "p95_change_ms": _finite(self.p95_change_ms),
            "contributions": [
                {
                    "cause": c.cause,
                    "name": c.name,
                    "ms": round(c.ms, 3),
                    "share": round(c.share, 4),
                    "share_interval": [_finite(c.share_low), _finite(c.share_high)],
                }
                for c in self.contributions
            ],
            "rows": [self.rows_before, self.rows_after],
            "population": [self.population_before, self.population_after],
            "resamples": self.resamples,
            "confidence": self.config.confidence,
            "seconds": round(self.seconds, 3),
            "method": self.method,
        }


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def _causal_model() -> Any:
    model = gcm.StructuralCausalModel(nx.DiGraph(CAUSAL_EDGES))
    for node in model.graph.nodes:
        if model.graph.in_degree(node) == 0:
            model.set_causal_mechanism(node, gcm.EmpiricalDistribution())
        else:
            model.set_causal_mechanism(
                node, gcm.AdditiveNoiseModel(gcm.ml.create_linear_regressor())
            )
    return model


def _mean_change(before: np.ndarray, after: np.ndarray) -> float:
    return float(np.mean(after) - np.mean(before))


def contributions_ms(
    before: pd.DataFrame, after: pd.DataFrame, config: AttributionConfig, seed: int
) -> dict[str, float]:
    """Each cause's contribution (ms) to the change in mean latency from `before` to `after`."""
    gcm.config.disable_progress_bars()
    old, new = _causal_model(), _causal_model()
    np.random.seed(seed)  # gcm draws from numpy's global generator
    gcm.fit(old, before)
    gcm.fit(new, after)
    result = gcm.distribution_change_of_graphs(
        old,
        new,
        TARGET,
        num_samples=config.shapley_samples,
        difference_estimation_func=_mean_change,
        shapley_config=ShapleyConfig(
            approximation_method=ShapleyApproximationMethods.PERMUTATION,
            num_permutations=config.shapley_permutations,
            n_jobs=1,  # joblib's process pool costs more than these small evaluations
        ),
    )
    return {str(k): float(v) for k, v in result.items()}


def attribute_latency(
    before: StageSample,
    after: StageSample,
    config: AttributionConfig = AttributionConfig(),
    clock: Callable[[], float] = time.monotonic,
) -> LatencyAttribution:
    """Split the latency change from `before` to `after` into its causes, within the time budget."""
    started = clock()
    a, b = before.frame[list(STAGE_COLUMNS)], after.frame[list(STAGE_COLUMNS)]
    sizes = {
        "rows_before": len(a),
        "rows_after": len(b),
        "population_before": before.population,
        "population_after": after.population,
        "config": config,
    }
    if min(len(a), len(b)) < config.min_rows:
        return LatencyAttribution(
            AttributionStatus.too_few_rows,
            f"too few requests to attribute: {len(a)} before and {len(b)} after, fewer than "
            f"the {config.min_rows} each needs",
            **sizes,  # type: ignore[arg-type]
        )
    point = contributions_ms(a, b, config, config.seed)
    rng = np.random.default_rng(config.seed)
    draws: list[dict[str, float]] = []
    changes: list[float] = []
    la, lb = a[TARGET].to_numpy(), b[TARGET].to_numpy()
    for i in range(config.resamples):
        if clock() - started > config.budget_s * (i + 1) / (i + 2):  # keep room for one more
            break
        ia, ib = rng.integers(0, len(a), len(a)), rng.integers(0, len(b), len(b))
        draws.append(contributions_ms(a.iloc[ia], b.iloc[ib], config, config.seed + 1 + i))
        changes.append(float(lb[ib].mean() - la[ia].mean()))
    return _summarise(point, draws, changes, la, lb, clock() - started, sizes, config)


def _summarise(
    point: dict[str, float],
    draws: list[dict[str, float]],
    changes: list[float],
    before_ms: np.ndarray,
    after_ms: np.ndarray,
    seconds: float,
    sizes: dict[str, Any],
    config: AttributionConfig,
) -> LatencyAttribution:
    change = float(after_ms.mean() - before_ms.mean())
    p95 = float(np.percentile(after_ms, 95) - np.percentile(before_ms, 95))
    tail = (1 - config.confidence) / 2
    enough = len(draws) >= config.min_resamples

    def interval(values: list[float]) -> tuple[float, float]:
        if not enough:
            return math.nan, math.nan
        return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))

    low, high = interval(changes)
    contributions = []
    for cause in sorted(point, key=lambda c: -point[c]):
        shares = [d[cause] / total for d, total in zip(draws, changes, strict=True) if total]
        s_low, s_high = interval(shares) if shares else (math.nan, math.nan)
        share = point[cause] / change if change else math.nan
        contributions.append(Contribution(cause, point[cause], share, s_low, s_high))
    ranked = tuple(contributions)
    figures = (
        f"mean latency {change:+.1f} ms"
        + (f" [{low:+.1f}, {high:+.1f}]" if enough else "")
        + f" (P95 {p95:+.1f} ms)"
    )
    shown = [c for c in ranked if abs(c.share) >= 0.05][:4] or list(ranked[:1])
    parts = ", ".join(
        f"{c.name} {c.share:.0%}"
        + (f" [{c.share_low:.0%}, {c.share_high:.0%}]" if math.isfinite(c.share_low) else "")
        for c in shown
    )
    evidence = (
        f"{sizes['rows_before']:,} vs {sizes['rows_after']:,} requests sampled from "
        f"{sizes['population_before']:,} vs {sizes['population_after']:,}; "
        + (
            f"{config.confidence:.0%} percentile bootstrap over {len(draws)} resamples"
            if enough
            else f"no interval: the {config.budget_s:g} s budget allowed {len(draws)} resamples, "
            f"fewer than {config.min_resamples}"
        )
    )
    status = AttributionStatus.attributed
    verdict_text = f"{figures}: {parts}"
    if abs(change) < config.min_change_ms or (enough and low <= 0 <= high):
        status = AttributionStatus.no_change
        verdict_text = f"no latency change to attribute: {figures}"
    elif enough and len(ranked) > 1 and ranked[0].share_low <= ranked[1].share_high:
        status = AttributionStatus.cannot_separate
        verdict_text = (
            f"{figures}: the data cannot separate {ranked[0].name} from {ranked[1].name} "
            f"(their intervals overlap): {parts}"
        )
    return LatencyAttribution(
        status,
        f"{verdict_text} ({evidence})",
        change,
        low,
        high,
        p95,
        ranked,
        resamples=len(draws),
        seconds=seconds,
        **sizes,
    )


def failed_attribution(exc: Exception) -> LatencyAttribution:
    """An attribution that raised: said as data; the verdict it was to explain stands."""
    return LatencyAttribution(
        AttributionStatus.failed, f"root-cause attribution failed: {type(exc).__name__}: {exc}"
    )


def window_attribution(
    read: Reader,
    before: tuple[str, str, datetime, datetime],
    after: tuple[str, str, datetime, datetime],
    config: AttributionConfig = AttributionConfig(),
) -> LatencyAttribution:
    """Attribution between two (slot, version, start, end) populations read through `read`.

    Never raises: a failed query or analysis is a `failed` attribution, so the verdict it
    explains is recorded and acted on all the same.
    """
    try:
        return attribute_latency(read(*before), read(*after), config)
    except Exception as exc:  # explaining must never stop the decision it explains
        log.exception("root-cause attribution failed")
        return failed_attribution(exc)


# -- task shells: run after the decision they explain, never before it --------------------------


def _reader(settings: Settings, config: AttributionConfig) -> Reader:
    """Samples from the log store, connected on first use (inside the attribution's guard)."""
    client: list[Any] = []

    def read(slot: str, version: str, start: datetime, end: datetime) -> StageSample:
        if not client:
            client.append(
                connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
            )
        return sample_stage_rows(client[0], start, end, slot, config.max_rows, version)

    return read


def explained(
    settings: Settings, release: Release, gate: GateResult, attribution: LatencyAttribution
) -> GateResult:
    """`gate` carrying its attribution, which is also recorded as an `attribution` release event."""
    try:
        record(
            settings,
            release,
            EventKind.attribution,
            attribution.status,
            attribution.statement,
            gate=gate.gate,
            **attribution.as_dict(),
        )
    except LOG_STORE_ERRORS:  # the verdict stands and carries it; only the event is missing
        log.exception("could not record the attribution of %s", release.version)
    return gate.model_copy(
        update={
            "attribution": attribution.as_dict(),
            "reason": f"{gate.reason}; why: {attribution.statement}",
            "measurements": gate.measurements | attribution.measurements(),
        }
    )


@task(name="explain-canary-rejection", cache_policy=NO_CACHE)
def explain_canary_rejection(
    settings: Settings,
    release: Release,
    baseline_version: str,
    gate: GateResult,
    config: AttributionConfig = AttributionConfig(),
) -> GateResult:
    """A rejected canary's verdict with why its latency regressed (canary vs baseline, since deploy).

    Called once the canary is out of traffic; a verdict that was not a latency regression is
    returned as it is.
    """
    if not latency_regressed(gate):
        return gate
    start, end = canary_period.fn(settings, release)
    attribution = window_attribution(
        _reader(settings, config),
        ("baseline", baseline_version, start, end),
        ("canary", release.version, start, end),
        config,
    )
    return explained(settings, release, gate, attribution)


@task(name="explain-guard-decision", cache_policy=NO_CACHE)
def explain_guard_decision(
    settings: Settings,
    champion: Release,
    decision: GateResult,
    live: GateResult,
    window_minutes: float,
    config: AttributionConfig = AttributionConfig(),
) -> GateResult:
    """The guard's decision with why the champion's latency rose: its window before vs now.

    Called after the guard acted; without a live P95 breach the decision is returned as it is.
    """
    p95, limit = live.measurements.get("p95_ms"), live.thresholds.get("max_p95_ms")
    if live.verdict is not Verdict.failed or p95 is None or limit is None or p95 <= limit:
        return decision
    end = datetime.now(UTC)
    window = timedelta(minutes=window_minutes)
    attribution = window_attribution(
        _reader(settings, config),
        ("stable", champion.version, end - 2 * window, end - window),
        ("stable", champion.version, end - window, end),
        config,
    )
    return explained(settings, champion, decision, attribution)
