"""Statistics and causal estimation of latency's effect on GMV, over per-session rows.

Preparation (complete rows, device indicators), descriptive figures (correlation, latency bins),
robust OLS, and DoWhy's back-door and front-door estimates with refutations. Pure: frames in,
report types out. The business translation and the canary-versus-stable comparison are in
`core.impact.translation`.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from core.impact.types import (
    COVARIATES,
    MEDIATOR,
    OUTCOME,
    TREATMENT,
    Correlation,
    EffectEstimate,
    ImpactOptions,
    LatencyBin,
    Refutation,
)

Z95 = float(stats.norm.ppf(0.975))


# -- latency summaries ----------------------------------------------------------------------------
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
