"""Does live traffic still look like the champion's training window? Two detectors, one verdict.

1. **The seed's distance-decay score** over the dense feature vector (the 18 dense model inputs,
   standardised by the reference). The stream is the last `history` reference vectors followed
   by the live window's vectors (in a seeded random order: order within a window is not what is
   tested); each vector's score is its mean Euclidean distance to the `history` vectors before
   it. Live vectors unlike the reference stand far from the reference history and, as history
   fills with them, the score decays back: the seed's "distance decay". Scores are averaged per
   batch of `batch` vectors and z-scored against the same batch means of a reference-only stream;
   the score alarms when `rising` consecutive batches are at or above `sigma`, each higher than
   the one before (2.5 σ, rising three times in a row). That is a detector of drift that builds
   up within a window; a window that is shifted all through shows only as a burst at its start
   that then decays, which the rising rule by design does not call. The rule looks at each batch,
   so its false-alarm rate grows with the batches a window has: a 30-second window of the
   deployed stack's clean shop traffic (32,000 impressions, 1,280 batches) failed that way, with
   every feature passing; on 300 clean windows of that shape (`bench.drift`, `served_clean`) the
   rule alarmed on none over their first 200, 400 or 800 batches and on 1 over all 1,280 (an
   exploratory run with three feeds a session instead of four: 0, 1, 2 and 7 of 300). So the
   score runs over a seeded random sample of
   at most `score_vectors` (5,000: 200 batches) of the window's vectors; order within a window is
   not tested anyway, and the per-feature statistics still see every impression.
2. **Per-feature statistics** over every impression, both samples weighted alike (one
   impression, one vote), each counted at its effective size N²/Σm² over sessions of m
   impressions (`effective_size`: a session's impressions share user, device, region and
   context, and at this size a test stays conservative however alike they are). Chosen by type
   and effective size as Evidently does: under `large_sample` (1,000) a two-sample
   Kolmogorov–Smirnov test for dense features (Kolmogorov's distribution at the effective sizes)
   and a χ² test of homogeneity on counts scaled to the effective sizes for categorical ones
   (a first-order Rao–Scott correction), plus for each dense feature a z test of its mean with
   the variance clustered by session (`clustered_mean`, p from Student's t with sessions − 1
   degrees of freedom); each at a Bonferroni-corrected level
   (`alpha` / tests). From `large_sample` on, effect sizes that do not turn every tiny shift of a
   large sample into an alarm: the Wasserstein distance in units of the reference's standard
   deviation for dense features, the Jensen–Shannon distance (base 2) for categorical ones, each
   against its limit (the JS limit raised to the distance sampling noise alone reaches at that
   level, `js_noise_floor`, where categories are many). One impression per session, as a first
   version drew, weighted the reference by the seeder's sessions and served traffic by its
   impressions: clean served traffic failed on session depth.

Not tested: ids (user, item, brand: hashed into thousands of buckets, they change by design),
the clock (hour, weekday: a 15-minute window is one hour of one day, the training window a week)
and position (set by the serving convention, `simulation.shoppers.SERVE_POSITION`).

A window with fewer than `min_rows` impressions is `inconclusive` with the count, never passed.
Either detector alarming fails the window; the drifted features are ranked by severity (the
statistic over its limit, or −log p over −log α).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import Field
from scipy import stats
from scipy.spatial.distance import jensenshannon

from relay.features import CATEGORICAL, DENSE, N_CATEGORICAL, to_model_input
from relay.types import GateResult, Verdict

DENSE_FEATURES: tuple[str, ...] = tuple(d.name for d in DENSE)
# See the module docstring for why the others are left out.
CATEGORICAL_FEATURES: tuple[str, ...] = ("category_id", "device_type", "region_id")
_BUCKETS = {c.name: c.buckets for c in CATEGORICAL}
NULL_VECTORS = 20_000  # 800 null batches: plenty for a mean and a standard deviation


@dataclass(frozen=True)
class DriftRules:
    """When a window counts as drifted. The one home of drift-watch's defaults."""

    min_rows: Annotated[int, Field(ge=1)] = 200
    history: Annotated[int, Field(ge=1)] = 100  # the seed's "last 100"
    # vectors per score sample; four batches fill the history
    batch: Annotated[int, Field(ge=1)] = 25
    sigma: Annotated[float, Field(gt=0)] = 2.5
    rising: Annotated[int, Field(ge=1)] = 3  # consecutive batches at or above sigma
    # the score's sample of a window (200 batches): its false-alarm rate grows with the batches
    score_vectors: Annotated[int, Field(ge=1)] = 5_000
    large_sample: Annotated[int, Field(ge=1)] = 1_000  # from here on: distances, not tests
    # family-wise, Bonferroni-split over the features tested
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.01
    wasserstein_limit: Annotated[float, Field(gt=0)] = 0.1  # in reference standard deviations
    jensen_shannon_limit: Annotated[float, Field(gt=0, le=1)] = 0.1
    seed: int = 0
    # after one alert, no other for this long (no release storm); drift-watch reads it
    cooldown_hours: Annotated[float, Field(ge=0)] = 6.0


@dataclass(frozen=True)
class FeatureDrift:
    """One feature's statistic against its limit."""

    feature: str
    method: str
    statistic: float
    limit: float
    p_value: float | None
    drifted: bool
    severity: float  # >= 1 when drifted


@dataclass(frozen=True)
class ScoreTrace:
    """The distance-decay score of a window: batch z-scores and where it alarmed first."""

    z: list[float]
    alarm_batch: int | None  # the batch that completed the run of `rising`, None if none
    reference_mean: float
    reference_std: float


@dataclass
class Reference:
    """The training window prepared once: standardisation, history, null, every impression."""

    history: np.ndarray  # the standardised dense vectors live windows are streamed after
    mean: np.ndarray
    std: np.ndarray
    dense: np.ndarray  # every reference impression's 18 dense inputs (pipeline scale)
    categorical: dict[str, np.ndarray]  # impressions per code of each tested categorical feature
    n_eff: float  # the impressions' effective sample size, clustered by session
    dense_mean: np.ndarray  # each dense feature's mean over every impression
    dense_mean_var: np.ndarray  # its variance, clustered by session
    null_mean: float
    null_std: float


def dense_vectors(frame: pd.DataFrame) -> np.ndarray:
    """The 18 dense model inputs (after the pipeline's log1p / clip) as float64."""
    return to_model_input(frame)[:, N_CATEGORICAL:].astype(np.float64)


def effective_size(sessions: pd.Series) -> float:
    """N² / Σ m_s², for N impressions in sessions of m_s: the sample size the tests count.

    A session's impressions share its user, device, region and context: they are not
    independent draws, and a test that counted them as such would see drift in every window.
    With this size a statistic's variance is bounded as if each session's impressions were
    perfectly alike (Var F̂(x) ≤ F(1−F)·Σm_s²/N²), so the tests stay conservative whatever the
    correlation, while the statistic itself still uses every impression.
    """
    counts = sessions.value_counts().to_numpy().astype(np.float64)
    return float(counts.sum() ** 2 / (counts**2).sum()) if len(counts) else 0.0


def clustered_mean(x: np.ndarray, sessions: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Column means of `x` over every row, and their variance clustered by session.

    The sandwich estimator: G/(G-1) · Σ_sessions (Σ_rows in it (x − mean))² / n². Rows of one
    session may be correlated in any way; sessions are taken as independent.
    """
    codes, unique = pd.factorize(sessions)
    n, g = len(x), len(unique)
    mean = x.mean(axis=0)
    residual = np.zeros((g, x.shape[1]))
    np.add.at(residual, codes, x - mean)
    var = (residual**2).sum(axis=0) / n**2 * (g / max(g - 1, 1))
    return mean, var


def prepare_reference(frame: pd.DataFrame, rules: DriftRules) -> Reference:
    """Standardise, and calibrate the score's null on two session-disjoint halves of the reference.

    Live sessions are never reference sessions, so the null must not let a vector meet its own
    session's other impressions in the history either.
    """
    if len(frame) < 2 * rules.history + rules.batch * (rules.rising + 4):
        raise ValueError(f"a reference of {len(frame)} rows is too small to calibrate drift")
    rng = np.random.default_rng(rules.seed)
    x = dense_vectors(frame)
    mean, std = x.mean(axis=0), np.maximum(x.std(axis=0), 1e-9)
    z = (x - mean) / std
    codes, unique = pd.factorize(frame["session_id"])
    in_first = np.zeros(len(unique), dtype=bool)
    in_first[rng.permutation(len(unique))[: len(unique) // 2]] = True
    first_half = in_first[codes]
    a = z[first_half][rng.permutation(int(first_half.sum()))]
    b = z[~first_half][rng.permutation(int((~first_half).sum()))]
    null = _batch_scores(a[-rules.history :], b[:NULL_VECTORS], rules)
    dense_mean, dense_mean_var = clustered_mean(x, frame["session_id"])
    return Reference(
        history=a[-rules.history :],
        mean=mean,
        std=std,
        dense=x,
        categorical={n: _counts(frame[n], _BUCKETS[n]) for n in CATEGORICAL_FEATURES},
        n_eff=effective_size(frame["session_id"]),
        dense_mean=dense_mean,
        dense_mean_var=dense_mean_var,
        null_mean=float(null.mean()),
        null_std=float(max(null.std(ddof=1), 1e-9)),
    )


def _batch_scores(history: np.ndarray, live: np.ndarray, rules: DriftRules) -> np.ndarray:
    """Mean distance of each live vector to the `history` vectors before it, per batch."""
    stream = np.vstack([history, live])
    h = len(history)
    n_batches = len(live) // rules.batch
    out = np.empty(n_batches)
    sq = (stream**2).sum(axis=1)
    for b in range(n_batches):
        lo, hi = h + b * rules.batch, h + (b + 1) * rules.batch
        window = stream[lo - h : hi]  # every vector a batch member can look back on
        d2 = sq[lo:hi, None] + sq[None, lo - h : hi] - 2 * stream[lo:hi] @ window.T
        d = np.sqrt(np.maximum(d2, 0.0))
        # member i (at lo+i) looks at the h vectors before it: columns i .. i+h-1 of `window`
        idx = np.arange(rules.batch)[:, None] + np.arange(h)[None, :]
        out[b] = d[np.arange(rules.batch)[:, None], idx].mean()
    return out


def distance_score(ref: Reference, live: pd.DataFrame, rules: DriftRules) -> ScoreTrace:
    """The seed's score over (a sample of `score_vectors` of) a live window, z-scored against
    the reference's null."""
    rng = np.random.default_rng(rules.seed + 1)
    x = (dense_vectors(live) - ref.mean) / ref.std
    x = x[rng.permutation(len(x))[: rules.score_vectors]]
    z = (_batch_scores(ref.history, x, rules) - ref.null_mean) / ref.null_std
    return ScoreTrace([float(v) for v in z], first_alarm(z, rules), ref.null_mean, ref.null_std)


def first_alarm(z: np.ndarray | list[float], rules: DriftRules) -> int | None:
    """The batch completing the first run of `rising` batches at or above `sigma`, each above
    the one before ("rising three times in a row"); None if there is none."""
    run, previous = 0, -np.inf
    for b, value in enumerate(z):
        run = run + 1 if value >= rules.sigma and value > previous else 0
        previous = value
        if run >= rules.rising:
            return b
    return None


def feature_drift(ref: Reference, live: pd.DataFrame, rules: DriftRules) -> list[FeatureDrift]:
    """Each tested feature's statistic over every impression, by type and effective sample size
    (sessions, `effective_size`), most severe first."""
    n = effective_size(live["session_id"])
    tested = len(DENSE_FEATURES) + len(CATEGORICAL_FEATURES)
    tests = tested + (len(DENSE_FEATURES) if n < rules.large_sample else 0)
    level = rules.alpha / tests
    out: list[FeatureDrift] = []
    live_dense = dense_vectors(live)
    # the Kolmogorov distribution's argument: D · sqrt(n₁n₂/(n₁+n₂)), at the effective sizes
    scale = math.sqrt(ref.n_eff * n / (ref.n_eff + n)) if n > 0 else 0.0
    if n < rules.large_sample:
        live_mean, live_var = clustered_mean(live_dense, live["session_id"])
        shift_z = (live_mean - ref.dense_mean) / np.sqrt(
            np.maximum(live_var + ref.dense_mean_var, 1e-18)
        )
        # a clustered variance from G sessions is itself uncertain: Student's t with G - 1
        # degrees of freedom, not the normal, or a window of a few sessions alarms by chance
        df = max(live["session_id"].nunique() - 1, 1)
    for j, name in enumerate(DENSE_FEATURES):
        a, b = ref.dense[:, j], live_dense[:, j]
        if n < rules.large_sample:
            d = float(stats.ks_2samp(a, b).statistic)
            p_ks = float(stats.kstwobign.sf(d * scale))
            ks = _tested(name, "Kolmogorov-Smirnov", d, p_ks, level)
            p_shift = float(2 * stats.t.sf(abs(shift_z[j]), df))
            shift = _tested(
                name, "mean shift (session-clustered z)", float(shift_z[j]), p_shift, level
            )
            out.append(max(ks, shift, key=lambda f: f.severity))
        else:
            w = float(stats.wasserstein_distance(a, b)) / float(ref.std[j])
            out.append(_distance(name, "Wasserstein (ref. σ)", w, rules.wasserstein_limit))
    for name in CATEGORICAL_FEATURES:
        # impressions per code, scaled to the effective sizes (a first-order Rao-Scott
        # correction at the largest design effect the sessions allow)
        ref_counts = ref.categorical[name] * (ref.n_eff / ref.categorical[name].sum())
        live_raw = _counts(live[name], _BUCKETS[name])
        live_counts = live_raw * (n / live_raw.sum())
        if n < rules.large_sample:
            keep = (ref_counts + live_counts) > 0
            table = np.vstack([ref_counts[keep], live_counts[keep]])
            if table.shape[1] < 2:
                out.append(_tested(name, "chi-squared", 0.0, 1.0, level))
                continue
            chi2, p, _, _ = stats.chi2_contingency(table, correction=False)
            out.append(_tested(name, "chi-squared", float(chi2), float(p), level))
        else:
            js = float(jensenshannon(ref_counts, live_counts, base=2))
            floor = js_noise_floor(ref_counts, live_counts, rules.alpha / tested)
            limit = max(rules.jensen_shannon_limit, floor)
            out.append(_distance(name, "Jensen-Shannon", js, limit))
    return sorted(out, key=lambda f: f.severity, reverse=True)


def js_noise_floor(ref_counts: np.ndarray, live_counts: np.ndarray, level: float) -> float:
    """The Jensen-Shannon distance two samples of one distribution exceed with chance `level`.

    For many categories and a few thousand sessions sampling noise alone passes the 0.1 limit
    (64 categories, 2,500 sessions a side: ~0.12), so the limit is raised to this floor. Two
    samples of one distribution have JSD ≈ Σ(p̂−q̂)²/m / (8 ln 2) bits, and Σ(p̂−q̂)²/m ≈
    χ²(k−1)·(1/n₁ + 1/n₂).
    """
    k = int(((ref_counts + live_counts) > 0).sum())
    if k < 2:
        return 0.0
    chi2 = float(stats.chi2.ppf(1 - level, k - 1))
    spread = 1 / ref_counts.sum() + 1 / live_counts.sum()
    return float(np.sqrt(chi2 * spread / (8 * np.log(2))))


def _counts(values: pd.Series, buckets: int) -> np.ndarray:
    """Impressions per code, codes clipped into the model's range as the pipeline clips them."""
    codes = np.clip(values.to_numpy().astype(np.int64), 0, buckets - 1)
    return np.bincount(codes, minlength=buckets).astype(np.float64)


def _tested(name: str, method: str, statistic: float, p: float, level: float) -> FeatureDrift:
    severity = float(-np.log10(max(p, 1e-300)) / -np.log10(level))
    return FeatureDrift(name, method, statistic, level, p, p < level, severity)


def _distance(name: str, method: str, value: float, limit: float) -> FeatureDrift:
    return FeatureDrift(name, method, value, limit, None, value > limit, value / limit)


@dataclass(frozen=True)
class DriftReport:
    """A window's verdict with everything it rests on."""

    gate: GateResult
    rows: int
    score: ScoreTrace | None
    features: list[FeatureDrift]

    @property
    def drifted_features(self) -> list[str]:
        return [f.feature for f in self.features if f.drifted]


def method_text(rules: DriftRules) -> str:
    """How a window is judged under `rules`, in the words the report prints."""
    return (
        f"distance-decay score (mean distance to the last {rules.history} dense vectors, batch z "
        f"vs the reference, alarm at {rules.sigma:g} σ rising {rules.rising} batches in a row, "
        f"over a random sample of at most {rules.score_vectors:,} of the window's impressions) + "
        "per feature over every impression at its session-clustered effective size: KS / χ² and, "
        "for dense features, a clustered z test of the mean (Bonferroni over all tests) under "
        f"{rules.large_sample:,} effective sessions, Wasserstein (ref. σ) / Jensen-Shannon from "
        f"{rules.large_sample:,}"
    )


def assess_drift(ref: Reference, live: pd.DataFrame, rules: DriftRules) -> DriftReport:
    """The window's verdict: inconclusive below min_rows, failed if either detector alarms."""
    n = len(live)
    thresholds = {
        "min_rows": float(rules.min_rows),
        "sigma": rules.sigma,
        "rising": float(rules.rising),
        "score_vectors": float(rules.score_vectors),
        "alpha": rules.alpha,
        "wasserstein_limit": rules.wasserstein_limit,
        "jensen_shannon_limit": rules.jensen_shannon_limit,
    }
    if n < rules.min_rows:
        gate = GateResult(
            gate="drift",
            verdict=Verdict.inconclusive,
            reason=f"{n} impressions in the window, fewer than {rules.min_rows}: no verdict",
            measurements={"rows": float(n)},
            thresholds=thresholds,
            method=method_text(rules),
        )
        return DriftReport(gate, n, None, [])
    score = distance_score(ref, live, rules)
    features = feature_drift(ref, live, rules)
    drifted = [f for f in features if f.drifted]
    measured = {
        "rows": float(n),
        "score_max_z": max(score.z) if score.z else 0.0,
        "drifted_features": float(len(drifted)),
    }
    parts = []
    if score.alarm_batch is not None:
        parts.append(
            f"distance-decay score at ≥ {rules.sigma:g} σ for {rules.rising} batches in a row "
            f"(by batch {score.alarm_batch + 1})"
        )
    if drifted:
        parts.append(
            "drifted: "
            + ", ".join(f"{f.feature} ({f.method} {f.statistic:.3g})" for f in drifted[:5])
        )
    if parts:
        verdict, reason = Verdict.failed, "; ".join(parts) + f" over {n} impressions"
    else:
        top = features[0]
        verdict = Verdict.passed
        reason = (
            f"no drift over {n} impressions: score max {measured['score_max_z']:.2f} σ, "
            f"most shifted {top.feature} ({top.method} {top.statistic:.3g}, limit {top.limit:.3g})"
        )
    gate = GateResult(
        gate="drift",
        verdict=verdict,
        reason=reason,
        measurements=measured,
        thresholds=thresholds,
        method=method_text(rules),
    )
    return DriftReport(gate, n, score, features)
