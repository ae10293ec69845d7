"""The release experiment: canary against baseline, clustered by user, with CUPED.

Method (every metric is a ratio of per-user sums; per-user metrics have the constant 1 below):

- Clustering by user: each cohort's ratio R = ΣY / ΣN is linearised per user (the delta method),
  L_i = (Y_i − R N_i) / N̄, so Var(R) ≈ Var(L) / n with n users, however many requests each made.
- CUPED (Deng, Xu, Kohavi, Walker, WSDM 2013): the covariate X_i is the same metric linearised
  over the user's pre-canary period (0 for a user with none there, i.e. at the mean); theta is
  the pooled within-cohort Cov(L, X) / Var(X), so the adjustment −θ(X̄_cohort − X̄) is unbiased
  because the canary cannot have changed what users did before it. With `covariates="all"`
  (the default) X is every metric's pre-canary value and theta the pooled within-cohort least
  squares (regression adjustment, Lin 2013): a user's pre-canary orders also predict their GMV,
  and never raise the asymptotic variance; "own" is CUPED with the single covariate.
- Intervals: normal, at `confidence`, on the absolute and (delta method) relative effect.
- MDE: (z_{1−α/2} + z_power) × SE, the effect the test would detect with that power.
- "Effect detected" for the release: Holm's correction across the business metrics, so with no
  effect at all the release is called at most α of the time, not 1 − (1 − α)^3.
- Sample ratio: chi-square of users per cohort against the configured split; p < srm_alpha makes
  the effect not valid (randomization broke, so any difference may be the broken split's).

All of it reads only `ExperimentData`'s moments: pure, and fast on any number of users.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np
from scipy import stats

from core.impact.experiment_types import (
    BASELINE,
    CANARY,
    METRICS,
    ExperimentFinding,
    ExperimentOptions,
    MetricEffect,
    MetricSpec,
    ReleaseExperiment,
    SampleRatio,
)
from logstore.experiment import COMPONENTS, CohortMoments, ExperimentData

METHOD = (
    "Canary vs baseline users (sticky hashed cohorts of equal share): per-user delta-method "
    "ratios clustered by user, CUPED with each user's pre-canary value of the same metric "
    "(theta from the pooled within-cohort covariance), normal intervals; business metrics "
    "called detected after Holm's correction; users seen in both cohorts left out."
)
NO_EXTRAPOLATION = (
    "These are effects on the canary's users over the canary's own period; they are not a "
    "forecast for a day or a year. Scaling them up assumes the effect stays constant over "
    "time (no novelty or learning), across the whole traffic mix and at full rollout."
)


def sample_ratio(canary_users: int, baseline_users: int, share: float, alpha: float) -> SampleRatio:
    """Chi-square (1 df) of users per cohort against `share` for the canary; fails at p < alpha."""
    total = canary_users + baseline_users
    if total == 0:
        return SampleRatio(
            canary_users=0, baseline_users=0, expected_canary_share=share, chi2=0.0,
            p_value=1.0, passed=False, source="estimator", reason="no users in either cohort",
        )  # fmt: skip
    expected = (total * share, total * (1 - share))
    chi2 = sum(
        (o - e) ** 2 / e for o, e in zip((canary_users, baseline_users), expected, strict=True)
    )
    p = float(stats.chi2.sf(chi2, 1))
    passed = p >= alpha
    reason = (
        f"{canary_users:,} canary vs {baseline_users:,} baseline users against a configured "
        f"{share:.0%} canary share: chi-square {chi2:.2f}, p = {p:.2g} "
        + ("(consistent with the split)" if passed else f"< {alpha:g}: sample-ratio mismatch")
    )
    return SampleRatio(
        canary_users=canary_users, baseline_users=baseline_users, expected_canary_share=share,
        chi2=chi2, p_value=p, passed=passed, source="estimator", reason=reason,
    )  # fmt: skip


def _matrices(c: CohortMoments) -> tuple[np.ndarray, np.ndarray]:
    """The cohort's component sums S and centred scatter C = Σ z zᵀ − S Sᵀ / n."""
    sums = np.array([c.sums[x] for x in COMPONENTS])
    products = np.array([[c.product(x, y) for y in COMPONENTS] for x in COMPONENTS])
    return sums, products - np.outer(sums, sums) / c.users


def _linearised(numerator: str, denominator: str, ratio: float, nbar: float) -> np.ndarray:
    """Coefficients over COMPONENTS of the per-user (Y − R N) / N̄ (the delta method)."""
    form = np.zeros(len(COMPONENTS))
    form[COMPONENTS.index(numerator)] += 1 / nbar
    form[COMPONENTS.index(denominator)] -= ratio / nbar
    return form


def _covariates(spec: MetricSpec, cohorts: tuple[CohortMoments, ...], every: bool) -> np.ndarray:
    """The pre-canary covariates as columns: the metric's own (CUPED), or every metric's."""
    columns = []
    for other in (spec, *(m for m in METRICS if m is not spec)) if every else (spec,):
        num, den = other.pre_numerator, other.pre_denominator
        pre_den = sum(c.sums[den] for c in cohorts)
        if pre_den <= 0:
            continue
        ratio = sum(c.sums[num] for c in cohorts) / pre_den  # pooled: the same in both cohorts
        columns.append(_linearised(num, den, ratio, pre_den / sum(c.users for c in cohorts)))
    return np.array(columns).T if columns else np.zeros((len(COMPONENTS), 0))


def estimate_metric(
    spec: MetricSpec, canary: CohortMoments, baseline: CohortMoments, options: ExperimentOptions
) -> MetricEffect:
    """One metric's CUPED-adjusted effect with intervals and MDE, or why it is not measured."""
    base: dict[str, Any] = {"key": spec.key, "label": spec.label, "unit": spec.unit}
    for cohort in (canary, baseline):
        if cohort.sums[spec.denominator] <= 0:
            what = "impressions" if spec.denominator == "impressions" else spec.denominator
            return MetricEffect(
                **base, measured=False, reason=f"not measured: no {what} logged in the {cohort.cohort} cohort"
            )  # fmt: skip
    if (
        spec.denominator == "one"
        and canary.sums[spec.numerator] + baseline.sums[spec.numerator] == 0
    ):
        return MetricEffect(
            **base, measured=False, reason=f"not measured: no {spec.numerator} in either cohort"
        )
    cohorts = (canary, baseline)
    mats = [_matrices(c) for c in cohorts]
    ratios = [c.sums[spec.numerator] / c.sums[spec.denominator] for c in cohorts]
    forms = [
        _linearised(spec.numerator, spec.denominator, r, c.sums[spec.denominator] / c.users)
        for r, c in zip(ratios, cohorts, strict=True)
    ]
    x = _covariates(spec, cohorts, options.covariates == "all")
    x = x[:, [j for j in range(x.shape[1]) if sum(x[:, j] @ m[1] @ x[:, j] for m in mats) > 0]]
    cxx = sum(x.T @ m[1] @ x for m in mats)
    cxy = sum(x.T @ m[1] @ f for m, f in zip(mats, forms, strict=True))
    has_pre = x.shape[1] > 0  # no user did anything before the canary: nothing to adjust by
    theta = np.linalg.lstsq(cxx, cxy, rcond=None)[0] if has_pre else np.zeros(0)
    x_bar = x.T @ (mats[0][0] + mats[1][0]) / (canary.users + baseline.users)
    adjusted, variances, raw = [], [], []
    for (sums, scatter), form, ratio, c in zip(mats, forms, ratios, cohorts, strict=True):
        resid = form - x @ theta
        adjusted.append(ratio - float(theta @ (x.T @ sums / c.users - x_bar)))
        variances.append(max(float(resid @ scatter @ resid), 0.0) / (c.users - 1) / c.users)
        raw.append(max(float(form @ scatter @ form), 0.0) / (c.users - 1) / c.users)
    adj_c, adj_b = adjusted
    v_c, v_b = variances
    raw_var = sum(raw)
    effect, se = adj_c - adj_b, math.sqrt(v_c + v_b)
    z = float(stats.norm.ppf(0.5 + options.confidence / 2))
    mde = (z + float(stats.norm.ppf(options.power))) * se
    p = float(2 * stats.norm.sf(abs(effect) / se)) if se > 0 else (1.0 if effect == 0 else 0.0)
    relative = rel_low = rel_high = rel_mde = None
    if adj_b != 0:
        relative = adj_c / adj_b - 1
        rel_se = math.sqrt(v_c / adj_b**2 + adj_c**2 * v_b / adj_b**4)
        rel_low, rel_high = relative - z * rel_se, relative + z * rel_se
        rel_mde = mde / abs(adj_b)
    return MetricEffect(
        **base,
        measured=True,
        reason="" if has_pre else "no pre-canary data: CUPED adds nothing, the raw difference stands",
        canary_mean=ratios[0], baseline_mean=ratios[1], effect=effect,
        ci_low=effect - z * se, ci_high=effect + z * se,
        relative=relative,
        relative_ci_low=rel_low, relative_ci_high=rel_high,
        p_value=p, mde=mde, relative_mde=rel_mde,
        raw_effect=ratios[0] - ratios[1], raw_std_error=math.sqrt(raw_var), std_error=se,
        theta=[float(t) for t in theta],
        variance_reduction=1 - (v_c + v_b) / raw_var if raw_var > 0 else None,
    )  # fmt: skip


def holm_detected(effects: list[MetricEffect], alpha: float) -> set[str]:
    """Keys of the business metrics that Holm's step-down keeps significant at family-wise alpha."""
    tested = sorted(
        (m.p_value, m.key)
        for m in effects
        if m.measured and m.p_value is not None and _is_business(m.key)
    )
    detected: set[str] = set()
    for rank, (p, key) in enumerate(tested):
        if p > alpha / (len(tested) - rank):
            break
        detected.add(key)
    return detected


def _is_business(key: str) -> bool:
    return any(spec.key == key and spec.business for spec in METRICS)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} %"


def describe_effect(m: MetricEffect) -> str:
    """One plain sentence on a metric: the effect and its interval, or what was not detectable."""
    if not m.measured:
        return f"{m.label}: {m.reason}."
    interval = f"95 % CI {_pct(m.relative_ci_low)} to {_pct(m.relative_ci_high)}"
    if m.detected or (m.key == "latency_ms" and m.p_value is not None and m.p_value < 0.05):
        verb = "raised" if (m.effect or 0) > 0 else "lowered"
        return f"The candidate {verb} {m.label} by {_pct(m.relative)} ({interval})."
    return (
        f"No effect on {m.label} detected: {_pct(m.relative)} ({interval}); at this sample size "
        f"only a change of about ±{(m.relative_mde or 0) * 100:.1f} % would have been detected."
    )


def no_experiment(
    release_id: str,
    version: str,
    lineage_id: str,
    outcome: str,
    why: str,
    now: datetime,
    baseline_version: str | None = None,
) -> ReleaseExperiment:
    """The record of a release that ran no comparable canary, saying why (never a zero effect)."""
    return ReleaseExperiment(
        release_id=release_id, version=version, lineage_id=lineage_id, outcome=outcome,
        baseline_version=baseline_version, generated_at=now,
        finding=ExperimentFinding.no_experiment, headline=f"No experiment: {why}.", method=METHOD,
    )  # fmt: skip


def estimate_experiment(
    data: ExperimentData,
    identity: tuple[str, str, str, str],
    options: ExperimentOptions,
    now: datetime,
    srm_event: SampleRatio | None = None,
    period_note: str = "",
) -> ReleaseExperiment:
    """The release's experiment: every metric's effect, the sample-ratio check and the finding.

    `identity` is (release_id, version, lineage_id, outcome). `srm_event`, when the gate already
    recorded a sample-ratio verdict, is used instead of this estimator's own check.
    """
    release_id, version, lineage_id, outcome = identity
    canary, baseline = data.cohorts.get(CANARY), data.cohorts.get(BASELINE)
    users = (canary.users if canary else 0, baseline.users if baseline else 0)
    if canary is None or baseline is None or min(users) < options.min_users_per_cohort:
        why = (
            f"the canary had {users[0]} and the baseline {users[1]} users over "
            f"{(data.end - data.start).total_seconds():.0f} s, fewer than the "
            f"{options.min_users_per_cohort} per cohort a comparison needs"
        )
        return no_experiment(
            release_id, version, lineage_id, outcome, why, now, data.baseline_version
        )
    ratio = srm_event or sample_ratio(*users, options.canary_share, options.srm_alpha)
    effects = [estimate_metric(spec, canary, baseline, options) for spec in METRICS]
    detected = holm_detected(effects, 1 - options.confidence)
    effects = [m.model_copy(update={"detected": m.key in detected}) for m in effects]
    statements = [describe_effect(m) for m in effects]
    if period_note:
        statements.append(f"The comparison is {period_note}.")
    period = f"{(data.end - data.start).total_seconds() / 60:.1f}-minute canary"
    who = f"{users[0]:,} canary and {users[1]:,} baseline users"
    if not ratio.passed:
        finding = ExperimentFinding.not_valid
        headline = (
            f"Effect not valid: the cohorts failed the sample-ratio check ({ratio.reason}), so "
            f"the difference between them may come from how users were split, not the model."
        )
    elif detected:
        finding = ExperimentFinding.effect_detected
        names = [m for m in effects if m.key in detected]
        headline = (
            f"Over the {period} ({who}) the candidate changed "
            + "; ".join(f"{m.label} by {_pct(m.relative)}" for m in names)
            + " against the baseline (95 % intervals below, Holm-corrected)."
        )
    else:
        finding = ExperimentFinding.no_detectable_effect
        headline = (
            f"Over the {period} ({who}) no effect on click-through, orders or GMV was "
            f"detected; the intervals below say how large an effect could have gone unseen."
        )
    return ReleaseExperiment(
        release_id=release_id, version=version, lineage_id=lineage_id, outcome=outcome,
        baseline_version=data.baseline_version, generated_at=now,
        start=data.start, end=data.end, pre_start=data.pre_start,
        finding=finding, headline=headline, statements=statements,
        assumptions=[NO_EXTRAPOLATION], canary_users=users[0], baseline_users=users[1],
        crossed_users=data.crossed_users, sample_ratio=ratio, metrics=effects, method=METHOD,
        options=options,
    )  # fmt: skip
