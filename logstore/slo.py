"""Per-slot latency and error figures over a window of `inference_logs`.

Two shapes: `query_slot_stats` (point figures per slot: counts and quantiles, what the guard and
reports read) and `query_cohorts` (per-slot sums clustered by user and by second, what the
canary judge needs). Requests are not independent: routing is sticky per user, so one user's
requests land in one cohort together, and each slot has its own batcher and queue, so requests
that arrive in the same moment share its state. The judge estimates variances from these
clustered sums (the delta method for ratio metrics, two-way clustered); ClickHouse computes the
sums where the rows are, and only a score of numbers per slot leaves the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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

# Sums of per-cluster figures, clustered two ways: by user (sticky routing correlates one user's
# requests) and by second (a slot's own batcher and queue correlate requests that arrive
# together). Latency moments use answered requests only (status < 400); errors are 5xx over
# every request that reached a model; a client's 4xx is neither.
_CLUSTERS = """
    SELECT
        slot,
        model_version,
        count() AS clusters,
        sum(answered * answered) AS aa,
        sum(log_sum * log_sum) AS ss,
        sum(answered * log_sum) AS a_s,
        sum(requests * requests) AS rr,
        sum(errors * errors) AS ee,
        sum(requests * errors) AS re
    FROM
    (
        SELECT
            slot,
            model_version,
            {key} AS cluster,
            toFloat64(countIf(status < 400)) AS answered,
            toFloat64(countIf(status < 400 OR status >= 500)) AS requests,
            toFloat64(countIf(status >= 500)) AS errors,
            sumIf(log(greatest(latency_ms, 0.001)), status < 400) AS log_sum
        FROM inference_logs
        WHERE ts >= {{start:DateTime64(3, 'UTC')}} AND ts < {{end:DateTime64(3, 'UTC')}}
          AND slot IN {{slots:Array(String)}}
        GROUP BY slot, model_version, cluster
    )
    GROUP BY slot, model_version
"""

_COHORT_SQL = f"""
SELECT
    slot,
    model_version,
    totals.answered,
    totals.requests,
    totals.errors,
    totals.log_sum,
    totals.log_sq,
    totals.q[1],
    totals.q[2],
    totals.q[3],
    users.clusters, users.aa, users.ss, users.a_s, users.rr, users.ee, users.re,
    seconds.clusters, seconds.aa, seconds.ss, seconds.a_s, seconds.rr, seconds.ee, seconds.re,
    totals.q[4], totals.q[5], totals.q[6], totals.q[7]
FROM
(
    SELECT
        slot,
        model_version,
        toFloat64(countIf(status < 400)) AS answered,
        toFloat64(countIf(status < 400 OR status >= 500)) AS requests,
        toFloat64(countIf(status >= 500)) AS errors,
        sumIf(log(greatest(latency_ms, 0.001)), status < 400) AS log_sum,
        sumIf(pow(log(greatest(latency_ms, 0.001)), 2), status < 400) AS log_sq,
        quantilesExactIf(0.5, 0.95, 0.99, 0.93, 0.97, 0.985, 0.995)(latency_ms, status < 400) AS q
    FROM inference_logs
    WHERE ts >= {{start:DateTime64(3, 'UTC')}} AND ts < {{end:DateTime64(3, 'UTC')}}
      AND slot IN {{slots:Array(String)}}
    GROUP BY slot, model_version
) AS totals
JOIN ({_CLUSTERS.format(key="user_id")}) AS users USING (slot, model_version)
JOIN ({_CLUSTERS.format(key="toStartOfSecond(ts)")}) AS seconds USING (slot, model_version)
"""  # the two keys are fixed expressions of this module; every value travels as a parameter


# Canary and baseline share each moment's load: per second, the cross-products of their sums,
# so the variance of their difference can subtract what they have in common.
_PAIRED_SECONDS_SQL = """
SELECT
    count() AS seconds,
    sum(c_s * b_s), sum(c_s * b_a), sum(c_a * b_s), sum(c_a * b_a),
    sum(c_e * b_e), sum(c_e * b_r), sum(c_r * b_e), sum(c_r * b_r)
FROM
(
    SELECT
        second,
        toFloat64(countIf(is_canary AND ok)) AS c_a,
        toFloat64(countIf(NOT is_canary AND ok)) AS b_a,
        toFloat64(countIf(is_canary AND (ok OR failed))) AS c_r,
        toFloat64(countIf(NOT is_canary AND (ok OR failed))) AS b_r,
        toFloat64(countIf(is_canary AND failed)) AS c_e,
        toFloat64(countIf(NOT is_canary AND failed)) AS b_e,
        sumIf(log_latency, is_canary AND ok) AS c_s,
        sumIf(log_latency, NOT is_canary AND ok) AS b_s
    FROM
    (
        SELECT
            toStartOfSecond(ts) AS second,
            slot = 'canary' AS is_canary,
            status < 400 AS ok,
            status >= 500 AS failed,
            log(greatest(latency_ms, 0.001)) AS log_latency
        FROM inference_logs
        WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
          AND ((slot = 'canary' AND model_version = {canary:String})
               OR (slot = 'baseline' AND model_version = {baseline:String}))
    )
    GROUP BY second
    HAVING c_r > 0 AND b_r > 0
)
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
class ClusterSums:
    """Sums over clusters c (users, or seconds) of per-cluster figures and their products.

    For cluster c: a_c answered requests, s_c the sum of their log latencies, r_c requests that
    reached a model, e_c of them 5xx. These give cluster-robust variances without shipping rows.
    """

    clusters: int
    aa: float  # Σ a_c²
    ss: float  # Σ s_c²
    a_s: float  # Σ a_c s_c
    rr: float  # Σ r_c²
    ee: float  # Σ e_c²
    re: float  # Σ r_c e_c


@dataclass(frozen=True)
class CohortSums:
    """One slot's requests over a period: totals, quantiles, and sums clustered two ways."""

    slot: str
    model_version: str
    answered: float  # requests answered (status < 400): the latency sample
    requests: float  # requests that reached a model (answered or 5xx): the error sample
    errors: float  # 5xx
    log_sum: float  # Σ log latency over answered requests
    log_sq: float  # Σ (log latency)² over answered requests
    p50_ms: float
    p95_ms: float
    p99_ms: float
    by_user: ClusterSums
    by_second: ClusterSums
    # the quantiles' neighbours, for their variance (core.gate.quantile): Q(.93), Q(.97) ...
    q93_ms: float = float("nan")
    q97_ms: float = float("nan")
    q985_ms: float = float("nan")  # ... and Q(.985), Q(.995)
    q995_ms: float = float("nan")

    @property
    def users(self) -> int:
        return self.by_user.clusters


@dataclass(frozen=True)
class PairedSeconds:
    """Cross-products, over the seconds both served, of canary (c) and baseline (b) sums."""

    seconds: int
    sc_sb: float  # Σ s_c s_b (log-latency sums)
    sc_ab: float  # Σ s_c a_b
    ac_sb: float  # Σ a_c s_b
    ac_ab: float  # Σ a_c a_b (answered counts)
    ec_eb: float  # Σ e_c e_b (5xx counts)
    ec_rb: float  # Σ e_c r_b
    rc_eb: float  # Σ r_c e_b
    rc_rb: float  # Σ r_c r_b (requests)


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


@dataclass(frozen=True)
class RequestRate:
    """How fast the fleet is being asked now: requests over the span they actually cover."""

    requests: int
    span_s: float  # from the first request in the lookback to its end

    @property
    def rps(self) -> float:
        return self.requests / self.span_s if self.span_s > 0 else 0.0


def query_request_rate(client: Client, start: datetime, end: datetime) -> RequestRate:
    """Requests (every slot but a load test's) in [start, end), over the span from the first of them to `end`.

    Traffic that began inside the lookback (a shop started a minute ago) is measured over the
    minute it has run, not diluted over the whole lookback.
    """
    count, first = client.query(
        "SELECT count(), min(ts) FROM inference_logs "
        "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} "
        "AND slot != 'loadtest'",  # a capacity check's load is not the fleet's traffic
        parameters={"start": start, "end": end},
    ).result_rows[0]
    if not count:
        return RequestRate(0, 0.0)
    first_at = first if first.tzinfo else first.replace(tzinfo=UTC)
    return RequestRate(int(count), max((end - first_at).total_seconds(), 1.0))


def query_cohorts(
    client: Client, start: datetime, end: datetime, slots: tuple[str, ...]
) -> list[CohortSums]:
    """Sums for each (slot, version) among `slots` that served requests in [start, end)."""
    result = client.query(
        _COHORT_SQL, parameters={"start": start, "end": end, "slots": list(slots)}
    )
    return [_cohort(row) for row in result.result_rows]


def _cohort(row: Sequence[Any]) -> CohortSums:
    slot, version, *numbers = row
    answered, requests, errors, log_sum, log_sq, p50, p95, p99 = (float(x) for x in numbers[:8])

    def clusters(values: list) -> ClusterSums:
        aa, ss, a_s, rr, ee, re = (float(x) for x in values[1:])
        return ClusterSums(int(values[0]), aa, ss, a_s, rr, ee, re)

    return CohortSums(
        str(slot),
        str(version),
        answered,
        requests,
        errors,
        log_sum,
        log_sq,
        p50,
        p95,
        p99,
        by_user=clusters(numbers[8:15]),
        by_second=clusters(numbers[15:22]),
        q93_ms=float(numbers[22]),
        q97_ms=float(numbers[23]),
        q985_ms=float(numbers[24]),
        q995_ms=float(numbers[25]),
    )


def query_paired_seconds(
    client: Client, start: datetime, end: datetime, canary: str, baseline: str
) -> PairedSeconds:
    """Canary x baseline per-second cross-products over [start, end)."""
    row = client.query(
        _PAIRED_SECONDS_SQL,
        parameters={"start": start, "end": end, "canary": canary, "baseline": baseline},
    ).result_rows[0]
    return PairedSeconds(int(row[0]), *(float(x or 0.0) for x in row[1:]))


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
    ts: np.ndarray,
) -> CohortSums:
    """The same sums as `query_cohorts`, computed from rows in memory (to replay recorded logs).

    `ts` is in seconds; clusters by second use its floor, as ClickHouse's toStartOfSecond does.
    """
    ok = status < 400
    reached = ok | (status >= 500)
    failed = status >= 500
    logs = np.where(ok, np.log(np.maximum(latency_ms, 0.001)), 0.0)

    def clustered(keys: np.ndarray) -> ClusterSums:
        _, index = np.unique(keys, return_inverse=True)
        k = int(index.max()) + 1 if len(index) else 0

        def per(weights: np.ndarray) -> np.ndarray:
            return np.bincount(index, weights=weights.astype(float), minlength=k)

        a, r, e, s_ = per(ok), per(reached), per(failed), per(logs)
        return ClusterSums(
            k,
            float(a @ a),
            float(s_ @ s_),
            float(a @ s_),
            float(r @ r),
            float(e @ e),
            float(r @ e),
        )

    q = exact_quantiles(latency_ms[ok], QUANTILE_LEVELS)
    return CohortSums(
        slot,
        model_version,
        answered=float(ok.sum()),
        requests=float(reached.sum()),
        errors=float(failed.sum()),
        log_sum=float(logs.sum()),
        log_sq=float((logs * logs).sum()),
        p50_ms=q[0],
        p95_ms=q[1],
        p99_ms=q[2],
        by_user=clustered(user_ids),
        by_second=clustered(np.floor(ts)),
        q93_ms=q[3],
        q97_ms=q[4],
        q985_ms=q[5],
        q995_ms=q[6],
    )


QUANTILE_LEVELS = (0.5, 0.95, 0.99, 0.93, 0.97, 0.985, 0.995)  # as _COHORT_SQL asks for them


def exact_quantiles(values: np.ndarray, levels: Sequence[float]) -> list[float]:
    """ClickHouse's quantileExact: the sorted value at index floor(level * n), NaN when empty."""
    if len(values) == 0:
        return [float("nan")] * len(levels)
    ordered = np.sort(values)
    n = len(ordered)
    return [float(ordered[min(int(level * n), n - 1)]) for level in levels]


def paired_seconds_of(
    canary: tuple[np.ndarray, ...], baseline: tuple[np.ndarray, ...]
) -> PairedSeconds:
    """The same as `query_paired_seconds` from rows in memory: (user, latency, status, ts) each."""

    def per_second(rows: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        _, latency, status, ts = rows
        seconds, index = np.unique(np.floor(ts), return_inverse=True)
        ok = status < 400

        def per(w: np.ndarray) -> np.ndarray:
            return np.bincount(index, weights=w.astype(float), minlength=len(seconds))

        logs = np.where(ok, np.log(np.maximum(latency, 0.001)), 0.0)
        return {
            "second": seconds,
            "a": per(ok),
            "r": per(ok | (status >= 500)),
            "e": per(status >= 500),
            "s": per(logs),
        }

    c, b = per_second(canary), per_second(baseline)
    _, ci, bi = np.intersect1d(c["second"], b["second"], return_indices=True)
    both = (c["r"][ci] > 0) & (b["r"][bi] > 0)  # as the query's HAVING: a model was reached
    ci, bi = ci[both], bi[both]
    pick_c = {k: v[ci] for k, v in c.items()}
    pick_b = {k: v[bi] for k, v in b.items()}

    def dot(x: str, y: str) -> float:
        return float(pick_c[x] @ pick_b[y])

    return PairedSeconds(
        len(ci),
        dot("s", "s"),
        dot("s", "a"),
        dot("a", "s"),
        dot("a", "a"),
        dot("e", "e"),
        dot("e", "r"),
        dot("r", "e"),
        dot("r", "r"),
    )
