"""Business impact of latency: what a millisecond costs in GMV, with causal estimates.

Pure functions take per-session rows (joined and aggregated in ClickHouse by `logstore.impact`)
and return an `ImpactReport`; thin @task shells query, store and publish. Every analysis carries
the assumptions it rests on, and the finding says plainly when the data cannot support a
conclusion (too few sessions, a failed refutation, estimators that disagree).

Effects are in GMV per session per millisecond of the session's mean request latency.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field
from scipy import stats

from logstore.impact import (
    JoinCoverage,
    count_join_coverage,
    read_latency_histogram,
    read_latency_profile,
    read_session_outcomes,
)
from logstore.spool import connect_for_reading
from model_store import ModelStore, open_store
from model_store.store import blob_key
from relay.errors import StoreError, VersionNotFound
from relay.settings import Settings
from relay.types import BlobRef
from tasks.workdir import run_workdir

Z95 = float(stats.norm.ppf(0.975))
TREATMENT = "latency_mean_ms"
OUTCOME = "gmv"
MEDIATOR = "session_length_s"
COVARIATES = ("device_type", "user_age")
CANARY = "canary"
STABLE = "stable"
REPORT_KIND = "impact-report"


class ImpactFinding(StrEnum):
    """What the report concludes, strongest claim last."""

    no_data = "no_data"
    insufficient_data = "insufficient_data"
    refuted = "refuted"
    estimators_disagree = "estimators_disagree"
    no_detectable_effect = "no_detectable_effect"
    effect_detected = "effect_detected"


class ImpactWindow(BaseModel, frozen=True):
    """Sessions that start in [start, end), UTC."""

    start: datetime
    end: datetime

    @property
    def days(self) -> float:
        return (self.end - self.start).total_seconds() / 86_400

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


class ImpactOptions(BaseModel, frozen=True):
    """Run knobs of the analysis (flow parameters; defaults suit a day of traffic)."""

    min_sessions: int = Field(default=500, ge=10)
    min_sessions_per_slot: int = Field(default=100, ge=2)
    refutation_simulations: int = Field(default=10, ge=2, le=200)
    max_refutation_sessions: int = Field(default=50_000, ge=100)
    latency_bins: int = Field(default=10, ge=2, le=50)
    subset_fraction: float = Field(default=0.8, gt=0.1, lt=1.0)
    max_session: timedelta = timedelta(hours=1)
    seed: int = 0


class Correlation(BaseModel):
    """Pearson's r between two per-session columns, with p-value (H0: r = 0) and 95 % CI."""

    x: str
    y: str
    r: float
    p_value: float
    ci_low: float
    ci_high: float
    n: int


class EffectEstimate(BaseModel):
    """An effect of +1 ms mean latency on an outcome, per session, with its 95 % interval."""

    key: str
    label: str
    outcome: str
    unit: str
    value: float
    ci_low: float
    ci_high: float
    std_error: float
    p_value: float | None
    n: int
    interval_method: str

    def covers(self, value: float) -> bool:
        return self.ci_low <= value <= self.ci_high

    def excludes_zero(self) -> bool:
        return not self.covers(0.0)


class Refutation(BaseModel):
    """One DoWhy refutation: the re-estimate, what a sound analysis would give, pass or fail."""

    key: str
    label: str
    expected: float
    new_effect: float
    tolerance: float
    passed: bool
    dowhy_p_value: float | None
    simulations: int
    sessions: int
    criterion: str


class BusinessTranslation(BaseModel):
    """The causal effect at the observed traffic: GMV per day per ms of mean latency."""

    sessions_per_day: float
    gmv_per_day: float
    gmv_per_day_per_ms: float
    ci_low: float
    ci_high: float

    @property
    def gmv_per_day_per_100ms(self) -> float:
        return 100 * self.gmv_per_day_per_ms


class SlotComparison(BaseModel):
    """Canary versus stable: the latency difference and the GMV it implies, per release."""

    available: bool
    reason: str
    stable_version: str | None = None
    canary_version: str | None = None
    stable_sessions: int = 0
    canary_sessions: int = 0
    stable_latency_ms: float | None = None
    canary_latency_ms: float | None = None
    latency_diff_ms: float | None = None
    latency_diff_ci: tuple[float, float] | None = None
    implied_gmv_per_session: float | None = None
    implied_gmv_per_session_ci: tuple[float, float] | None = None
    implied_gmv_per_day: float | None = None
    implied_gmv_per_day_ci: tuple[float, float] | None = None
    measured_gmv_diff: float | None = None
    measured_gmv_diff_ci: tuple[float, float] | None = None


class LatencyBin(BaseModel):
    """Mean of an outcome among sessions whose mean latency falls in [low_ms, high_ms]."""

    low_ms: float
    high_ms: float
    mid_ms: float
    sessions: int
    mean: float
    ci_low: float
    ci_high: float


class ImpactReport(BaseModel):
    """Everything the report shows; the HTML, JSON and markdown are renderings of this."""

    window: ImpactWindow
    versions: list[str]
    generated_at: datetime
    finding: ImpactFinding
    headline: str
    caveats: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    assumptions: dict[str, list[str]] = Field(default_factory=dict)
    coverage: dict[str, int] = Field(default_factory=dict)
    sessions: int = 0
    covariates: list[str] = Field(default_factory=list)
    correlations: list[Correlation] = Field(default_factory=list)
    estimates: list[EffectEstimate] = Field(default_factory=list)
    session_length_estimate: EffectEstimate | None = None
    refutations: list[Refutation] = Field(default_factory=list)
    identification: str = ""
    graph_edges: list[tuple[str, str]] = Field(default_factory=list)
    translation: BusinessTranslation | None = None
    slots: SlotComparison | None = None
    latency_profile: list[dict[str, Any]] = Field(default_factory=list)
    latency_histogram: list[dict[str, Any]] = Field(default_factory=list)
    histogram_bin_ms: float = 0.0
    gmv_by_latency: list[LatencyBin] = Field(default_factory=list)
    length_by_latency: list[LatencyBin] = Field(default_factory=list)

    def estimate(self, key: str) -> EffectEstimate | None:
        return next((e for e in self.estimates if e.key == key), None)

    @property
    def causal(self) -> EffectEstimate | None:
        """The headline causal estimate: DoWhy back-door with a cluster-robust interval."""
        return self.estimate("dowhy_backdoor")


@dataclass(frozen=True)
class ImpactData:
    """What ClickHouse returned for a window: per-session rows and small summaries."""

    window: ImpactWindow
    versions: list[str]
    sessions: pd.DataFrame
    coverage: JoinCoverage
    latency_profile: pd.DataFrame
    latency_histogram: pd.DataFrame
    histogram_bin_ms: float


ASSUMPTIONS: dict[str, list[str]] = {
    "Pearson correlation": [
        "Measures linear association only; it is not an effect and is confounded by device type.",
        "p-value tests r = 0 assuming independent sessions.",
    ],
    "OLS gmv ~ latency + user_age + device_type": [
        "GMV is linear and additive in latency, age and device; one effect per ms for everyone.",
        "Device type and age are the only common causes of latency and GMV (no hidden confounder).",
        "Intervals are cluster-robust by user (sessions of one user may be correlated, "
        "GMV variance differs between sessions).",
    ],
    "DoWhy back-door (linear regression)": [
        "The causal graph shown is correct and complete: device_type is the only confounder.",
        "Positivity: every device type is seen across the range of latencies.",
        "Linear outcome model. The point estimate equals the OLS one, so the interval quoted is "
        "the OLS cluster-robust one; DoWhy's own interval assumes equal GMV variance in every "
        "session and is shown beside it for reference.",
    ],
    "DoWhy front-door (two-stage regression via session length)": [
        "Latency affects GMV only through session length (full mediation).",
        "Nothing unobserved drives both latency and session length.",
        "Given latency, nothing unobserved drives both session length and GMV.",
        "Linear stages; the interval is the delta method over both stages' robust errors.",
        "These are different assumptions from the back-door ones: agreement is evidence, "
        "disagreement means at least one set is wrong.",
    ],
    "Refutations": [
        "Placebo: replacing latency by a permutation of itself must give an effect near 0.",
        "Random common cause: adding an independent random covariate must not move the estimate.",
        "Data subset: re-estimating on random subsets must give about the same estimate.",
        "Each passes when its re-estimate lies within the 95 % margin (1.96 standard errors) of "
        "the value a sound analysis would give; a pass cannot prove the graph right.",
    ],
    "Business translation": [
        "The per-ms effect holds across the observed latency range (no extrapolation beyond it).",
        "Sessions per day = sessions that made a request in the window / window length in days.",
        "GMV in the currency units logged in user_sessions.",
    ],
    "Canary vs stable": [
        "Sessions are assigned to slots at random, so the latency difference is caused by the "
        "version; a session belongs to the slot that served most of its requests.",
        "The implied GMV effect multiplies that difference by the causal per-ms effect, as if "
        "the canary served all traffic; the measured GMV difference is the direct experiment "
        "and is usually too noisy to read on its own.",
    ],
}


# -- window --------------------------------------------------------------------------------------
def resolve_window(
    start: datetime | None,
    end: datetime | None,
    last_hours: float | None,
    now: datetime | None = None,
) -> ImpactWindow:
    """The window from explicit bounds, or the `last_hours` before `end` (default now, UTC)."""
    end = (end or now or datetime.now(UTC)).astimezone(UTC)
    if start is None:
        if last_hours is None or last_hours <= 0:
            raise ValueError(f"give start or a positive last_hours, got last_hours={last_hours}")
        start = end - timedelta(hours=last_hours)
    start = start.astimezone(UTC)
    if end <= start:
        raise ValueError(f"window end {end.isoformat()} must be after start {start.isoformat()}")
    return ImpactWindow(start=start, end=end)


def histogram_bin_ms(profile: pd.DataFrame, bins: int = 50) -> float:
    """A round bin width so `bins` bins span every version's p99 latency."""
    if profile.empty:
        return 10.0
    top = float(profile["p99_ms"].max())
    raw = max(top, 1.0) / (bins - 1)
    magnitude = 10 ** np.floor(np.log10(raw))
    return float(next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw))


# -- preparation ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreparedSessions:
    """Complete rows, with device type as numeric indicator columns the models can use."""

    frame: pd.DataFrame
    covariates: list[str]  # the covariates (by concept) that vary: device_type, user_age
    confounders: list[str]  # device indicator columns: causes of latency and of GMV
    precision: list[str]  # ["user_age"] when it varies: a cause of GMV only
    notes: list[str]

    @property
    def adjustment(self) -> list[str]:
        return self.confounders + self.precision


def prepare_sessions(sessions: pd.DataFrame) -> PreparedSessions:
    """Rows usable by every model, and the covariates that vary (one-level ones are dropped)."""
    notes: list[str] = []
    frame = sessions.copy()
    numeric = [TREATMENT, OUTCOME, MEDIATOR, "user_age"]
    for column in numeric:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    frame["device_type"] = frame["device_type"].astype("object")
    usable = np.isfinite(frame[numeric].to_numpy()).all(axis=1) & frame["device_type"].notna()
    if (~usable).any():
        notes.append(
            f"{int((~usable).sum())} sessions with missing or non-finite latency, GMV, session "
            "length, age or device were excluded."
        )
    frame = frame.loc[usable].reset_index(drop=True)
    covariates = []
    for column in COVARIATES:
        levels = frame[column].nunique()
        if levels >= 2:
            covariates.append(column)
        elif len(frame):
            value = frame[column].iloc[0]
            notes.append(
                f"{column} has a single value ({value}) in this window: it was dropped from every "
                "model, so estimates hold for that group only and it cannot confound them here."
            )
    confounders = []
    if "device_type" in covariates:
        # Indicators computed once: DoWhy would one-hot encode a categorical column again on
        # every refit of every refutation, which dominates the run time at scale.
        levels = sorted(str(v) for v in frame["device_type"].unique())
        for level in levels[1:]:
            name = _indicator_name(level, taken=set(frame.columns))
            frame[name] = (frame["device_type"].astype(str) == level).astype("float64")
            confounders.append(name)
        notes.append(
            f"device_type enters the models as indicators against {levels[0]!r} ("
            + ", ".join(confounders)
            + ")."
        )
    precision = ["user_age"] if "user_age" in covariates else []
    return PreparedSessions(frame, covariates, confounders, precision, notes)


def _indicator_name(level: str, taken: set[str]) -> str:
    base = "device_" + (re.sub(r"\W+", "_", level).strip("_") or "blank")
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


# -- descriptive ---------------------------------------------------------------------------------
def correlate(frame: pd.DataFrame, x: str, y: str) -> Correlation | None:
    """Pearson's r of two columns, or None when either is constant (r is undefined)."""
    if len(frame) < 3 or frame[x].nunique() < 2 or frame[y].nunique() < 2:
        return None
    result = stats.pearsonr(frame[x], frame[y])
    ci = result.confidence_interval(0.95)
    return Correlation(
        x=x,
        y=y,
        r=float(result.statistic),
        p_value=float(result.pvalue),
        ci_low=float(ci.low),
        ci_high=float(ci.high),
        n=len(frame),
    )


def bin_by_latency(frame: pd.DataFrame, outcome: str, bins: int) -> list[LatencyBin]:
    """Mean outcome with a 95 % CI in quantile bins of session mean latency."""
    if frame.empty or frame[TREATMENT].nunique() < 2:
        return []
    codes = pd.qcut(frame[TREATMENT], q=bins, duplicates="drop")
    result = []
    for _, group in frame.groupby(codes, observed=True):
        values = group[outcome].to_numpy(dtype=np.float64)
        mean = float(values.mean())
        half = Z95 * float(values.std(ddof=1)) / np.sqrt(len(values)) if len(values) > 1 else 0.0
        result.append(
            LatencyBin(
                low_ms=float(group[TREATMENT].min()),
                high_ms=float(group[TREATMENT].max()),
                mid_ms=float(group[TREATMENT].median()),
                sessions=len(values),
                mean=mean,
                ci_low=mean - half,
                ci_high=mean + half,
            )
        )
    return result


# -- regression ----------------------------------------------------------------------------------
def _robust_fit(frame: pd.DataFrame, outcome: str, regressors: Sequence[str]) -> tuple[Any, str]:
    """OLS of outcome on a constant and numeric regressors, errors clustered by user when there
    are enough users, else HC1."""
    import statsmodels.api as sm

    exog = frame[list(regressors)].astype("float64")
    exog.insert(0, "const", 1.0)
    model = sm.OLS(frame[outcome].astype("float64"), exog)
    users = frame["user_id"].nunique() if "user_id" in frame else 0
    # QR, not the default pseudo-inverse: the design is full rank (one-level covariates are
    # dropped before), and an SVD per fit is most of a refit's time at 500k sessions.
    if users >= 50:
        groups = pd.factorize(frame["user_id"])[0]
        fit = model.fit(method="qr", cov_type="cluster", cov_kwds={"groups": groups})
        return fit, "cluster-robust (user)"
    return model.fit(method="qr", cov_type="HC1"), "heteroscedasticity-robust (HC1)"


def fit_ols(
    frame: pd.DataFrame, outcome: str, adjustment: Sequence[str], key: str, label: str
) -> EffectEstimate:
    """The latency coefficient of `outcome ~ latency + adjustment` with a robust 95 % CI."""
    fit, method = _robust_fit(frame, outcome, [TREATMENT, *adjustment])
    low, high = (float(v) for v in fit.conf_int(alpha=0.05).loc[TREATMENT])
    return EffectEstimate(
        key=key,
        label=label,
        outcome=outcome,
        unit="GMV per session per ms" if outcome == OUTCOME else "s per session per ms",
        value=float(fit.params[TREATMENT]),
        ci_low=low,
        ci_high=high,
        std_error=float(fit.bse[TREATMENT]),
        p_value=float(fit.pvalues[TREATMENT]),
        n=int(fit.nobs),
        interval_method=method,
    )


# -- causal --------------------------------------------------------------------------------------
def causal_graph(covariates: Sequence[str]) -> list[tuple[str, str]]:
    """The assumed DAG's edges, without nodes that do not vary in the data."""
    edges = [(TREATMENT, MEDIATOR), (MEDIATOR, OUTCOME)]
    if "device_type" in covariates:
        edges += [("device_type", TREATMENT), ("device_type", OUTCOME)]
    if "user_age" in covariates:
        edges.append(("user_age", OUTCOME))
    return edges


@contextmanager
def _quiet_dowhy() -> Iterator[None]:
    """DoWhy logs defaults and warns about pandas idioms on every call; none of it is news here."""
    logger = logging.getLogger("dowhy")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _dowhy_model(frame: pd.DataFrame, confounders: Sequence[str], precision: Sequence[str]) -> Any:
    """A CausalModel over the graph of `causal_graph`, device type as its indicator columns."""
    import networkx as nx
    from dowhy import CausalModel

    edges = [(TREATMENT, MEDIATOR), (MEDIATOR, OUTCOME)]
    edges += [(c, node) for c in confounders for node in (TREATMENT, OUTCOME)]
    edges += [(p, OUTCOME) for p in precision]
    columns = [TREATMENT, OUTCOME, MEDIATOR, *confounders, *precision]
    graph = nx.DiGraph(edges)
    graph.add_nodes_from(columns)
    return CausalModel(data=frame[columns], treatment=TREATMENT, outcome=OUTCOME, graph=graph)


def _backdoor(model: Any) -> tuple[Any, Any]:
    """DoWhy's back-door linear-regression estimate over the maximal adjustment set."""
    # Maximal adjustment also takes user_age: not a confounder, but a cause of GMV, so it
    # narrows the interval without biasing the estimate.
    estimand = model.identify_effect(
        proceed_when_unidentifiable=True, method_name="maximal-adjustment"
    )
    # DoWhy mutates the estimand it is given (and its deepcopy drops the mediation sets), so
    # every estimate gets a freshly identified one.
    estimate = model.estimate_effect(
        estimand,
        method_name="backdoor.linear_regression",
        control_value=0,
        treatment_value=1,
        confidence_intervals=True,
        effect_modifiers=[],  # one average effect; the graph would otherwise add user_age
    )
    return estimand, estimate


@dataclass(frozen=True)
class CausalResult:
    backdoor: EffectEstimate
    frontdoor: EffectEstimate | None
    refutations: list[Refutation]
    identification: str
    notes: list[str]


def estimate_causal_effect(
    prepared: PreparedSessions, robust: EffectEstimate, options: ImpactOptions
) -> CausalResult:
    """DoWhy: graph, identification, back-door and front-door estimates, and refutations.

    `robust` is the OLS fit of the same adjustment set; its cluster-robust interval replaces
    DoWhy's homoscedastic one for the headline (both are kept in the report).
    """
    notes: list[str] = []
    frame = prepared.frame
    with _quiet_dowhy():
        model = _dowhy_model(frame, prepared.confounders, prepared.precision)
        estimand, estimate = _backdoor(model)
        dowhy_ci = np.asarray(estimate.get_confidence_intervals(), dtype=float).ravel()
        dowhy_se = float(np.asarray(estimate.get_standard_error(), dtype=float).ravel()[0])
        value = float(estimate.value)
        if not np.isclose(value, robust.value, rtol=1e-6, atol=1e-9):
            notes.append(
                f"DoWhy's back-door estimate ({value:.6g}) differs from the OLS fit of the same "
                f"adjustment set ({robust.value:.6g}); its own interval is used."
            )
            low, high, se, method = float(dowhy_ci[0]), float(dowhy_ci[1]), dowhy_se, "DoWhy OLS"
        else:
            low, high, se, method = (
                robust.ci_low,
                robust.ci_high,
                robust.std_error,
                (robust.interval_method + f"; DoWhy's own: [{dowhy_ci[0]:.4g}, {dowhy_ci[1]:.4g}]"),
            )
        backdoor = EffectEstimate(
            key="dowhy_backdoor",
            label="DoWhy back-door (linear regression)",
            outcome=OUTCOME,
            unit="GMV per session per ms",
            value=value,
            ci_low=low,
            ci_high=high,
            std_error=se,
            p_value=float(2 * stats.norm.sf(abs(value / se))) if se > 0 else None,
            n=len(frame),
            interval_method=method,
        )
        identification = str(estimand)
        try:
            frontdoor = _frontdoor(model, frame)
        except Exception as exc:  # the second estimator is a cross-check; say why it is missing
            frontdoor = None
            notes.append(f"The front-door estimator could not run: {exc}")
        refutations = _refute(prepared, options)
    return CausalResult(backdoor, frontdoor, refutations, identification, notes)


def _frontdoor(model: Any, frame: pd.DataFrame) -> EffectEstimate:
    """DoWhy's front-door two-stage estimate, with a delta-method interval from robust stages."""
    estimand = model.identify_effect(proceed_when_unidentifiable=True)
    if not estimand.get_frontdoor_variables():
        raise ValueError("the graph gives no front-door variable")
    # DoWhy finds several valid adjustment sets per stage and picks one in set-iteration order,
    # which changes between processes; fixing the largest makes the estimate reproducible.
    first_set = _largest_set(estimand.mediation_first_stage_confounders)
    second_set = _largest_set(estimand.mediation_second_stage_confounders)
    estimand.mediation_first_stage_confounders["backdoor"] = first_set
    estimand.mediation_second_stage_confounders["backdoor"] = second_set
    estimate = model.estimate_effect(
        estimand,
        method_name="frontdoor.two_stage_regression",
        control_value=0,
        treatment_value=1,
        effect_modifiers=[],
    )
    first, _ = _robust_fit(frame, MEDIATOR, [TREATMENT, *first_set])
    second, method = _robust_fit(frame, OUTCOME, [MEDIATOR, *second_set])
    a, se_a = float(first.params[TREATMENT]), float(first.bse[TREATMENT])
    b, se_b = float(second.params[MEDIATOR]), float(second.bse[MEDIATOR])
    value = float(estimate.value)
    if not np.isclose(value, a * b, rtol=1e-6, atol=1e-9):
        raise ValueError(
            f"DoWhy's front-door value {value:.6g} is not the stage product {a * b:.6g}"
        )
    se = float(np.sqrt(b**2 * se_a**2 + a**2 * se_b**2))
    return EffectEstimate(
        key="dowhy_frontdoor",
        label="DoWhy front-door (two-stage via session length)",
        outcome=OUTCOME,
        unit="GMV per session per ms",
        value=value,
        ci_low=value - Z95 * se,
        ci_high=value + Z95 * se,
        std_error=se,
        p_value=float(2 * stats.norm.sf(abs(value / se))) if se > 0 else None,
        n=len(frame),
        interval_method=f"delta method over {method} stages",
    )


def _largest_set(candidates: dict[str, list[str]]) -> list[str]:
    """The largest candidate adjustment set (ties broken by name), for a deterministic choice."""
    options = sorted((sorted(v) for v in candidates.values()), key=lambda v: (-len(v), v))
    return options[0] if options else []


def _refute(prepared: PreparedSessions, options: ImpactOptions) -> list[Refutation]:
    """Placebo, random common cause and data subset against the back-door estimate."""
    frame = sample = prepared.frame
    if len(frame) > options.max_refutation_sessions:
        # Refutations refit the model many times; a seeded sample keeps them affordable and
        # the criterion below uses that sample's own standard error.
        sample = frame.sample(n=options.max_refutation_sessions, random_state=options.seed)
        sample = sample.reset_index(drop=True)
    reference = fit_ols(sample, OUTCOME, prepared.adjustment, "refutation_reference", "")
    model = _dowhy_model(sample, prepared.confounders, prepared.precision)
    _, estimate = _backdoor(model)
    original = float(estimate.value)
    tolerance = Z95 * reference.std_error
    plans: list[tuple[str, str, str, dict[str, Any], float]] = [
        (
            "placebo",
            "Placebo treatment (permuted latency)",
            "placebo_treatment_refuter",
            {"placebo_type": "permute"},
            0.0,
        ),
        ("random_common_cause", "Random common cause added", "random_common_cause", {}, original),
        (
            "data_subset",
            f"Data subset ({options.subset_fraction:.0%} of sessions)",
            "data_subset_refuter",
            {"subset_fraction": options.subset_fraction},
            original,
        ),
    ]
    results = []
    for key, label, method, extra, expected in plans:
        refuted = model.refute_estimate(
            estimate.target_estimand,
            estimate,
            method_name=method,
            num_simulations=options.refutation_simulations,
            random_seed=options.seed,
            **extra,
        )
        new_effect = float(refuted.new_effect)
        p_value = (refuted.refutation_result or {}).get("p_value")
        results.append(
            Refutation(
                key=key,
                label=label,
                expected=expected,
                new_effect=new_effect,
                tolerance=tolerance,
                passed=abs(new_effect - expected) <= tolerance,
                dowhy_p_value=float(p_value)
                if p_value is not None and np.isfinite(p_value)
                else None,
                simulations=options.refutation_simulations,
                sessions=len(sample),
                criterion=f"|re-estimate − {expected:.4g}| ≤ 1.96 × SE = {tolerance:.4g}",
            )
        )
    return results


# -- translation ---------------------------------------------------------------------------------
def _product_interval(a: float, se_a: float, b: float, se_b: float) -> tuple[float, float, float]:
    """a·b with a 95 % interval (Goodman's variance of a product of independent estimates)."""
    se = float(np.sqrt(a**2 * se_b**2 + b**2 * se_a**2 + se_a**2 * se_b**2))
    return a * b, a * b - Z95 * se, a * b + Z95 * se


def translate_to_business(
    causal: EffectEstimate, sessions_per_day: float, gmv_per_day: float
) -> BusinessTranslation:
    """GMV per day per ms of mean latency at the observed traffic, with its interval."""
    return BusinessTranslation(
        sessions_per_day=sessions_per_day,
        gmv_per_day=gmv_per_day,
        gmv_per_day_per_ms=causal.value * sessions_per_day,
        ci_low=causal.ci_low * sessions_per_day,
        ci_high=causal.ci_high * sessions_per_day,
    )


def compare_slots(
    frame: pd.DataFrame, causal: EffectEstimate | None, sessions_per_day: float, min_per_slot: int
) -> SlotComparison:
    """Canary minus stable: latency difference (Welch), its implied GMV effect, measured GMV."""
    slots = frame["slot"].astype("object")
    stable, canary = frame.loc[slots == STABLE], frame.loc[slots == CANARY]
    counts: dict[str, Any] = {"stable_sessions": len(stable), "canary_sessions": len(canary)}
    if len(canary) == 0 or len(stable) == 0:
        missing = CANARY if len(canary) == 0 else STABLE
        return SlotComparison(
            available=False, reason=f"no {missing} sessions in the window", **counts
        )
    if min(len(stable), len(canary)) < min_per_slot:
        return SlotComparison(
            available=False,
            reason=f"too few sessions to compare slots (stable {len(stable)}, canary "
            f"{len(canary)}; need {min_per_slot} each)",
            **counts,
        )
    latency = stats.ttest_ind(canary[TREATMENT], stable[TREATMENT], equal_var=False)
    lat_ci = latency.confidence_interval(0.95)
    diff = float(canary[TREATMENT].mean() - stable[TREATMENT].mean())
    diff_se = (float(lat_ci.high) - float(lat_ci.low)) / (2 * Z95)
    gmv = stats.ttest_ind(canary[OUTCOME], stable[OUTCOME], equal_var=False)
    gmv_ci = gmv.confidence_interval(0.95)
    result = SlotComparison(
        available=True,
        reason="",
        stable_version=str(stable["model_version"].mode().iloc[0]),
        canary_version=str(canary["model_version"].mode().iloc[0]),
        stable_latency_ms=float(stable[TREATMENT].mean()),
        canary_latency_ms=float(canary[TREATMENT].mean()),
        latency_diff_ms=diff,
        latency_diff_ci=(float(lat_ci.low), float(lat_ci.high)),
        measured_gmv_diff=float(canary[OUTCOME].mean() - stable[OUTCOME].mean()),
        measured_gmv_diff_ci=(float(gmv_ci.low), float(gmv_ci.high)),
        **counts,
    )
    if causal is None:
        return result.model_copy(
            update={"reason": "no causal estimate to translate the difference"}
        )
    value, low, high = _product_interval(diff, diff_se, causal.value, causal.std_error)
    return result.model_copy(
        update={
            "implied_gmv_per_session": value,
            "implied_gmv_per_session_ci": (low, high),
            "implied_gmv_per_day": value * sessions_per_day,
            "implied_gmv_per_day_ci": (low * sessions_per_day, high * sessions_per_day),
        }
    )


# -- the report ----------------------------------------------------------------------------------
def decide_finding(
    causal: EffectEstimate, frontdoor: EffectEstimate | None, refutations: Sequence[Refutation]
) -> ImpactFinding:
    """The strongest claim the estimates support."""
    if any(not r.passed for r in refutations):
        return ImpactFinding.refuted
    if frontdoor is not None and (
        frontdoor.ci_high < causal.ci_low or causal.ci_high < frontdoor.ci_low
    ):
        return ImpactFinding.estimators_disagree
    return (
        ImpactFinding.effect_detected
        if causal.excludes_zero()
        else ImpactFinding.no_detectable_effect
    )


def _money(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"


def headline_for(
    finding: ImpactFinding, reason: str, translation: BusinessTranslation | None
) -> str:
    """One sentence an analyst can quote, with units and the interval."""
    if translation is None:
        return reason
    per100 = translation.gmv_per_day_per_100ms
    interval = f"95 % CI {_money(100 * translation.ci_low)} to {_money(100 * translation.ci_high)}"
    claim = (
        f"+100 ms of mean latency changes GMV by {_money(per100)} per day ({interval}) at "
        f"{translation.sessions_per_day:,.0f} sessions/day"
    )
    if finding is ImpactFinding.effect_detected:
        return claim + "."
    if finding is ImpactFinding.no_detectable_effect:
        return (
            f"No detectable effect of latency on GMV: the data cannot tell the effect from zero "
            f"({claim})."
        )
    return f"Not a trustworthy estimate ({reason}): {claim}."


def analyse_impact(data: ImpactData, options: ImpactOptions) -> ImpactReport:
    """Every analysis of the issue over one window, with the finding and its caveats."""
    coverage = data.coverage
    base: dict[str, Any] = {
        "window": data.window,
        "versions": list(data.versions),
        "generated_at": datetime.now(UTC),
        "assumptions": ASSUMPTIONS,
        "coverage": {
            "session_rows": coverage.session_rows,
            "sessions": coverage.sessions,
            "duplicate_session_rows": coverage.duplicate_session_rows,
            "sessions_without_requests": coverage.sessions_without_requests,
            "requests": coverage.requests,
            "requests_without_session": coverage.requests_without_session,
            "unknown_session_ids": coverage.unknown_session_ids,
            "sessions_joined": len(data.sessions),
        },
        "latency_profile": data.latency_profile.to_dict(orient="records"),
        "latency_histogram": data.latency_histogram.to_dict(orient="records"),
        "histogram_bin_ms": data.histogram_bin_ms,
    }
    caveats = _coverage_caveats(coverage, data.versions)
    if data.sessions.empty:
        why = _why_empty(coverage, data.versions)
        return ImpactReport(
            **base,
            finding=ImpactFinding.no_data,
            caveats=caveats,
            headline=f"No data: no session in {data.window} has both a user_sessions row and "
            f"inference requests{why}. Nothing can be concluded.",
        )

    prepared = prepare_sessions(data.sessions)
    frame, covariates = prepared.frame, prepared.covariates
    notes = list(prepared.notes)
    mixed = int(pd.to_numeric(frame["mixed_versions"]).sum()) if "mixed_versions" in frame else 0
    if mixed:
        notes.append(
            f"{mixed:,} sessions were served by more than one model version; each counts for the "
            "version (and slot) that served the majority of its requests."
        )
    descriptive: dict[str, Any] = {
        "sessions": len(frame),
        "covariates": covariates,
        "graph_edges": causal_graph(covariates),
        "gmv_by_latency": bin_by_latency(frame, OUTCOME, options.latency_bins),
        "length_by_latency": bin_by_latency(frame, MEDIATOR, options.latency_bins),
        "correlations": [
            c
            for c in (correlate(frame, TREATMENT, OUTCOME), correlate(frame, TREATMENT, MEDIATOR))
            if c is not None
        ],
    }
    too_few = len(frame) < options.min_sessions
    flat = frame[TREATMENT].nunique() < 2 or float(frame[TREATMENT].std()) == 0.0
    if too_few or flat:
        reason = (
            f"only {len(frame)} usable sessions (the analysis needs at least {options.min_sessions})"
            if too_few
            else "every session saw the same latency, so its effect cannot be estimated"
        )
        return ImpactReport(
            **base,
            **descriptive,
            finding=ImpactFinding.insufficient_data,
            caveats=caveats,
            notes=notes,
            headline=f"Insufficient data: {reason}. Nothing causal can be concluded.",
        )

    adjustment = prepared.adjustment
    naive = fit_ols(frame, OUTCOME, [], "naive", "Naive (GMV on latency alone)")
    ols = fit_ols(frame, OUTCOME, adjustment, "ols", "OLS adjusted for " + _listed(covariates))
    length = fit_ols(frame, MEDIATOR, adjustment, "ols_session_length", "OLS session length")
    causal = estimate_causal_effect(prepared, ols, options)
    notes += causal.notes
    estimates = [naive, ols, causal.backdoor] + ([causal.frontdoor] if causal.frontdoor else [])

    days = data.window.days
    requesting = max(coverage.sessions - coverage.sessions_without_requests, len(frame))
    sessions_per_day = requesting / days
    gmv_per_day = float(frame[OUTCOME].sum()) / days * requesting / len(frame)
    translation = translate_to_business(causal.backdoor, sessions_per_day, gmv_per_day)
    slots = compare_slots(frame, causal.backdoor, sessions_per_day, options.min_sessions_per_slot)

    finding = decide_finding(causal.backdoor, causal.frontdoor, causal.refutations)
    reason = {
        ImpactFinding.refuted: "refutation failed: "
        + ", ".join(r.label for r in causal.refutations if not r.passed),
        ImpactFinding.estimators_disagree: "the back-door and front-door intervals do not overlap",
    }.get(finding, "")
    if finding is ImpactFinding.refuted:
        caveats.append(
            f"A refutation failed ({reason[len('refutation failed: ') :]}): the "
            "causal estimate should not be used until the cause is understood."
        )
    if finding is ImpactFinding.estimators_disagree:
        caveats.append(
            "The back-door and front-door estimates disagree: at least one of their "
            "assumption sets is wrong (hidden confounding, or latency acting on GMV "
            "other than through session length)."
        )
    if not naive.covers(causal.backdoor.value):
        notes.append(
            f"The naive slope ({naive.value:.4g} GMV/ms, 95 % CI {naive.ci_low:.4g} to "
            f"{naive.ci_high:.4g}) excludes the adjusted estimate ({causal.backdoor.value:.4g}): "
            f"the raw correlation is confounded (adjusted for: {_listed(covariates)})."
        )
    frontdoor = causal.frontdoor
    if frontdoor is not None and frontdoor.excludes_zero() != causal.backdoor.excludes_zero():
        notes.append(
            f"The front-door estimate ({frontdoor.value:.4g}, 95 % CI {frontdoor.ci_low:.4g} to "
            f"{frontdoor.ci_high:.4g}) {'excludes' if frontdoor.excludes_zero() else 'covers'} "
            "zero while the back-door one does not; the headline rests on the back-door estimate "
            "because full mediation by session length is the stronger assumption."
        )
    return ImpactReport(
        **base,
        **descriptive,
        finding=finding,
        headline=headline_for(finding, reason, translation),
        caveats=caveats,
        notes=notes,
        estimates=estimates,
        session_length_estimate=length,
        refutations=causal.refutations,
        identification=causal.identification,
        translation=translation,
        slots=slots,
    )


def _listed(covariates: Sequence[str]) -> str:
    return ", ".join(covariates) if covariates else "nothing (no covariate varies)"


def _coverage_caveats(coverage: JoinCoverage, versions: Sequence[str]) -> list[str]:
    caveats = []
    if coverage.sessions_without_requests:
        caveats.append(
            f"{coverage.sessions_without_requests:,} of {coverage.sessions:,} sessions logged no "
            "inference request (no latency to attribute): excluded from the models."
        )
    if coverage.requests_without_session:
        caveats.append(
            f"{coverage.requests_without_session:,} of {coverage.requests:,} requests "
            f"({coverage.unknown_session_ids:,} session ids) have no user_sessions row: excluded."
        )
    if coverage.duplicate_session_rows:
        caveats.append(
            f"{coverage.duplicate_session_rows:,} duplicate user_sessions rows: one row per "
            "session id was used."
        )
    return caveats


def _why_empty(coverage: JoinCoverage, versions: Sequence[str]) -> str:
    if coverage.sessions == 0 and coverage.requests == 0:
        return " (the window holds no sessions and no requests)"
    if coverage.sessions == 0:
        return f" (no user_sessions start in it; {coverage.requests:,} requests have no session)"
    if coverage.requests == 0:
        return f" ({coverage.sessions:,} sessions but no inference requests)"
    if versions:
        return f" for versions {', '.join(versions)}"
    return ""


# -- storage -------------------------------------------------------------------------------------
class StoredImpactReport(BaseModel):
    """Where a report's files went: blobs in the model store and the record that lists them."""

    report_id: str
    created_at: datetime
    attached_to: str | None
    record_key: str
    window: ImpactWindow
    versions: list[str]
    finding: ImpactFinding
    headline: str
    blobs: dict[str, BlobRef]
    html_url: str
    json_url: str


def record_key_for(attach_to: str | None, report_id: str) -> str:
    """Versions' reports live beside their manifest; others under reports/impact/."""
    if attach_to:
        return f"versions/{attach_to}/attachments/{REPORT_KIND}/{report_id}.json"
    return f"reports/impact/{report_id}.json"


def store_report_files(
    store: ModelStore,
    report: ImpactReport,
    html_path: Path,
    json_path: Path,
    attach_to: str | None,
) -> StoredImpactReport:
    """Store the HTML and JSON as blobs, then the record that lists them (written last, once).

    The record's `blobs` field names every blob it references, in the same shape as a
    manifest's, so store-wide tools (gc) can find the references.
    """
    if attach_to:
        store.get_manifest(attach_to)  # raises VersionNotFound: never attach to a missing version
    blobs = {"report.html": store.put_blob(html_path), "report.json": store.put_blob(json_path)}
    report_id = (
        f"{report.generated_at.strftime('%Y%m%dT%H%M%S%fZ')}-{blobs['report.json'].sha256[:12]}"
    )
    record = StoredImpactReport(
        report_id=report_id,
        created_at=report.generated_at,
        attached_to=attach_to,
        record_key=record_key_for(attach_to, report_id),
        window=report.window,
        versions=report.versions,
        finding=report.finding,
        headline=report.headline,
        blobs=blobs,
        html_url=store.backend.locate(blob_key(blobs["report.html"].sha256)),
        json_url=store.backend.locate(blob_key(blobs["report.json"].sha256)),
    )
    if not store.backend.put_bytes(
        record.record_key, record.model_dump_json(indent=2).encode(), exclusive=True
    ):
        raise StoreError(f"impact report record {record.record_key} already exists")
    return record


def list_impact_reports(store: ModelStore, version: str | None = None) -> list[StoredImpactReport]:
    """Stored impact reports of a version (or the unattached ones), oldest first."""
    prefix = record_key_for(version, "x").rsplit("/", 1)[0] + "/"
    return [
        StoredImpactReport.model_validate_json(store.backend.get_bytes(key))
        for key in store.backend.list_keys(prefix)
        if key.endswith(".json")
    ]


# -- task shells ---------------------------------------------------------------------------------
@task(name="query-impact-sessions", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def query_impact_sessions(
    settings: Settings, window: ImpactWindow, versions: list[str], max_session: timedelta
) -> ImpactData:
    """Per-session rows, join coverage and latency summaries for the window, from ClickHouse."""
    client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
    profile = read_latency_profile(client, window.start, window.end, versions)
    bin_ms = histogram_bin_ms(profile)
    return ImpactData(
        window=window,
        versions=list(versions),
        sessions=read_session_outcomes(client, window.start, window.end, versions, max_session),
        coverage=count_join_coverage(client, window.start, window.end, max_session),
        latency_profile=profile,
        latency_histogram=read_latency_histogram(
            client, window.start, window.end, bin_ms, 50, versions
        ),
        histogram_bin_ms=bin_ms,
    )


def _worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """Retry transient store failures, never a missing version (it will still be missing)."""
    try:
        state.result()
    except VersionNotFound:
        return False
    except Exception:
        return True
    return True


@task(
    name="check-report-target",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_worth_retrying,
    cache_policy=NO_CACHE,
)
def check_report_target(settings: Settings, attach_to: str | None) -> None:
    """Fail before any work when the report is to be filed under a version that does not exist."""
    if attach_to:
        open_store(settings).get_manifest(attach_to)  # raises VersionNotFound


@task(name="analyse-impact", cache_policy=NO_CACHE)
def analyse_latency_impact(data: ImpactData, options: ImpactOptions) -> ImpactReport:
    """The report's numbers (pure; a task so the UI shows its duration and failures)."""
    return analyse_impact(data, options)


@task(
    name="store-impact-report",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_worth_retrying,
    cache_policy=NO_CACHE,
)
def store_impact_report(
    settings: Settings, report: ImpactReport, attach_to: str | None
) -> StoredImpactReport:
    """Render HTML and JSON, store them in the model store, attached to a version if given."""
    from tasks.impact_report import render_html, render_json

    folder = run_workdir(settings) / "impact"
    folder.mkdir(parents=True, exist_ok=True)
    html_path, json_path = folder / "impact-report.html", folder / "impact-report.json"
    html_path.write_text(render_html(report), encoding="utf-8")
    json_path.write_text(render_json(report), encoding="utf-8")
    return store_report_files(open_store(settings), report, html_path, json_path, attach_to)


@task(name="publish-impact-summary", cache_policy=NO_CACHE)
def publish_impact_summary(report: ImpactReport, stored: StoredImpactReport) -> StoredImpactReport:
    """The markdown artifact with the headline numbers and links to the stored report."""
    from tasks.impact_report import render_markdown

    create_markdown_artifact(
        key=REPORT_KIND,
        markdown=render_markdown(report, stored),
        description=f"Latency → GMV impact over {report.window}: {report.finding.value}",
    )
    return stored
