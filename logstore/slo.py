"""Per-slot latency and error figures over a window of `inference_logs`.

Two shapes: `query_slot_stats` (point figures per slot: counts and quantiles, what the guard and
reports read) and `query_cohorts` (per-slot sums over *users*, what the canary judge needs).
Requests of one user are not independent: routing is sticky per user, so a slow user's many
requests all land in one cohort. The judge therefore treats the user as the unit and estimates
variances from per-user sums (the delta method for ratio metrics); ClickHouse computes those
sums where the rows are, and only a dozen numbers per slot leave the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from clickhouse_connect.driver.client import Client

# status >= 500 is the worker failing; 4xx is a client's bad request and not the model's fault
_WINDOW_SQL = """
SELECT
    slot,
    model_version,
    count() AS requests,
    quantile(0.5)(latency_ms) AS p50,
    quantile(0.95)(latency_ms) AS p95,
    quantile(0.99)(latency_ms) AS p99,
    countIf(status >= 500) / count() AS error_rate
FROM inference_logs
WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
GROUP BY slot, model_version
"""

# Inner: one row per (slot, version, user). Latency moments use answered requests only
# (status < 400); errors are 5xx over every request that reached a model.
_COHORT_SQL = """
SELECT
    slot,
    model_version,
    count() AS n_users,
    sum(answered) AS sum_a,
    sum(requests) AS sum_r,
    sum(errors) AS sum_e,
    sum(log_sum) AS sum_s,
    sum(answered * answered) AS sum_aa,
    sum(log_sum * log_sum) AS sum_ss,
    sum(answered * log_sum) AS sum_as,
    sum(requests * requests) AS sum_rr,
    sum(errors * errors) AS sum_ee,
    sum(requests * errors) AS sum_re,
    any(q)[1] AS p50,
    any(q)[2] AS p95,
    any(q)[3] AS p99
FROM
(
    SELECT
        slot,
        model_version,
        user_id,
        toFloat64(countIf(status < 400)) AS answered,
        toFloat64(countIf(status < 400 OR status >= 500)) AS requests,
        toFloat64(countIf(status >= 500)) AS errors,
        sumIf(log(greatest(latency_ms, 0.001)), status < 400) AS log_sum
    FROM inference_logs
    WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
      AND slot IN {slots:Array(String)}
    GROUP BY slot, model_version, user_id
) AS per_user
LEFT JOIN
(
    SELECT slot, model_version, quantilesIf(0.5, 0.95, 0.99)(latency_ms, status < 400) AS q
    FROM inference_logs
    WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
      AND slot IN {slots:Array(String)}
    GROUP BY slot, model_version
) AS quantiles USING (slot, model_version)
GROUP BY slot, model_version
"""

# Per-user median latency, canary (sample 0) against baseline (sample 1): a rank test whose
# units are independent. 'greater' asks whether the canary's users wait longer.
_MANN_WHITNEY_SQL = """
SELECT count() AS users, mannWhitneyUTest('greater')(user_median, sample) AS test
FROM
(
    SELECT user_id, if(slot = 'canary', 0, 1) AS sample, median(latency_ms) AS user_median
    FROM inference_logs
    WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
      AND status < 400
      AND ((slot = 'canary' AND model_version = {canary:String})
           OR (slot = 'baseline' AND model_version = {baseline:String}))
    GROUP BY user_id, sample
)
"""


@dataclass(frozen=True)
class SlotStats:
    """What one slot serving one version did over a window."""

    slot: str
    model_version: str
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    error_rate: float


@dataclass(frozen=True)
class CohortSums:
    """One slot's users over a period, as sums over users i of their per-user figures.

    For user i: a_i answered requests, s_i the sum of their log latencies, r_i requests that
    reached a model, e_i of them 5xx. Sums of squares and cross-products give cluster-robust
    variances without shipping rows.
    """

    slot: str
    model_version: str
    users: int
    answered: float  # Σ a_i
    requests: float  # Σ r_i
    errors: float  # Σ e_i
    log_sum: float  # Σ s_i
    answered_sq: float  # Σ a_i²
    log_sum_sq: float  # Σ s_i²
    answered_x_log: float  # Σ a_i s_i
    requests_sq: float  # Σ r_i²
    errors_sq: float  # Σ e_i²
    requests_x_errors: float  # Σ r_i e_i
    p50_ms: float
    p95_ms: float
    p99_ms: float


@dataclass(frozen=True)
class RankTest:
    """A one-sided Mann-Whitney U test on per-user median latency, canary > baseline."""

    users: int
    u_statistic: float
    p_value: float


def query_slot_stats(client: Client, start: datetime, end: datetime) -> list[SlotStats]:
    """One row per (slot, version) that served requests in [start, end)."""
    rows = client.query(_WINDOW_SQL, parameters={"start": start, "end": end}).result_rows
    return [
        SlotStats(
            slot=str(slot),
            model_version=str(version),
            requests=int(requests),
            p50_ms=float(p50),
            p95_ms=float(p95),
            p99_ms=float(p99),
            error_rate=float(error_rate),
        )
        for slot, version, requests, p50, p95, p99, error_rate in rows
    ]


def query_cohorts(
    client: Client, start: datetime, end: datetime, slots: tuple[str, ...]
) -> list[CohortSums]:
    """Per-user sums for each (slot, version) among `slots` that served requests in [start, end)."""
    result = client.query(
        _COHORT_SQL, parameters={"start": start, "end": end, "slots": list(slots)}
    )
    return [
        CohortSums(
            slot=str(row[0]),
            model_version=str(row[1]),
            users=int(row[2]),
            **{name: float(value) for name, value in zip(_COHORT_FLOATS, row[3:], strict=True)},
        )
        for row in result.result_rows
    ]


_COHORT_FLOATS = (
    "answered",
    "requests",
    "errors",
    "log_sum",
    "answered_sq",
    "log_sum_sq",
    "answered_x_log",
    "requests_sq",
    "errors_sq",
    "requests_x_errors",
    "p50_ms",
    "p95_ms",
    "p99_ms",
)


def query_rank_test(
    client: Client, start: datetime, end: datetime, canary: str, baseline: str
) -> RankTest | None:
    """Mann-Whitney U over users in [start, end); None when either cohort has under 2 users."""
    params = {"start": start, "end": end, "canary": canary, "baseline": baseline}
    counts = client.query(
        "SELECT countIf(slot = 'canary'), countIf(slot = 'baseline') FROM "
        "(SELECT DISTINCT user_id, slot FROM inference_logs "
        "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} "
        "AND status < 400 AND ((slot = 'canary' AND model_version = {canary:String}) "
        "OR (slot = 'baseline' AND model_version = {baseline:String})))",
        parameters=params,
    ).result_rows[0]
    if min(int(counts[0]), int(counts[1])) < 2:  # the test is undefined on one user
        return None
    users, test = client.query(_MANN_WHITNEY_SQL, parameters=params).result_rows[0]
    u, p = test.values() if isinstance(test, dict) else test  # a named tuple arrives as a dict
    return RankTest(users=int(users), u_statistic=float(u), p_value=float(p))


def cohort_sums_of(
    slot: str,
    model_version: str,
    user_ids: np.ndarray,
    latency_ms: np.ndarray,
    status: np.ndarray,
) -> CohortSums:
    """The same sums as `query_cohorts`, computed from rows in memory (to replay recorded logs)."""
    users, index = np.unique(user_ids, return_inverse=True)
    k = len(users)
    ok = status < 400
    reached = ok | (status >= 500)
    answered = np.bincount(index, weights=ok.astype(float), minlength=k)
    requests = np.bincount(index, weights=reached.astype(float), minlength=k)
    errors = np.bincount(index, weights=(status >= 500).astype(float), minlength=k)
    logs = np.where(ok, np.log(np.maximum(latency_ms, 0.001)), 0.0)
    log_sum = np.bincount(index, weights=logs, minlength=k)
    p50, p95, p99 = (
        np.quantile(latency_ms[ok], [0.5, 0.95, 0.99]) if ok.any() else (np.nan, np.nan, np.nan)
    )
    return CohortSums(
        slot=slot,
        model_version=model_version,
        users=k,
        answered=float(answered.sum()),
        requests=float(requests.sum()),
        errors=float(errors.sum()),
        log_sum=float(log_sum.sum()),
        answered_sq=float((answered * answered).sum()),
        log_sum_sq=float((log_sum * log_sum).sum()),
        answered_x_log=float((answered * log_sum).sum()),
        requests_sq=float((requests * requests).sum()),
        errors_sq=float((errors * errors).sum()),
        requests_x_errors=float((requests * errors).sum()),
        p50_ms=float(p50),
        p95_ms=float(p95),
        p99_ms=float(p99),
    )
