"""The release experiment's query: per-user sums of the canary and baseline cohorts, reduced to moments.

A user belongs to the cohort whose slot served their requests in [start, end) (the canary slot
with the candidate, or the baseline slot with the stable version loaded fresh); a user seen in
both (a weight change moved them) is counted and left out. Per user, over the canary:

    requests, latency_sum         inference_logs rows of the cohort's slot and version
    impressions, clicked          its impressions; clicked = any click or order on the
                                  (request, item), credited to its top-ranked showing (the
                                  gate's click-through rule, logstore/feedback.py)
    orders, gmv                   user_sessions started in the window whose requests the
                                  cohort's slot served

and the same sums over the pre-canary period [pre_start, pre_end), from every slot (before the
canary everyone was on stable): the CUPED covariates. ClickHouse then reduces each cohort to its
user count, the sum of every component and the sum of every product of two: 91 numbers per
cohort leave the database whatever the traffic (core/impact/experiment.py works from those).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the moments' types are read by the CLI, which must not import ClickHouse
    from clickhouse_connect.driver.client import Client

CANARY = "canary"
BASELINE = "baseline"
CROSSED = "crossed"
# One user's sums over the canary (plain names) and over the pre-canary period (pre_ names);
# `one` is the constant 1, the denominator of a per-user metric.
IN_CANARY = ("requests", "latency_sum", "impressions", "clicked", "orders", "gmv")
COMPONENTS: tuple[str, ...] = ("one", *IN_CANARY, *(f"pre_{c}" for c in IN_CANARY))


@dataclass(frozen=True)
class CohortMoments:
    """One cohort's users: their count, Σ of each component and Σ of each product of two."""

    cohort: str
    users: int
    sums: dict[str, float]
    products: dict[tuple[str, str], float]  # keyed (a, b) with a <= b in COMPONENTS order

    @classmethod
    def from_users(cls, cohort: str, columns: Mapping[str, Sequence[float]]) -> CohortMoments:
        """The moments of per-user values (any COMPONENTS missing are 0): what SQL computes."""
        n = len(next(iter(columns.values())))
        values = {c: np.asarray(columns.get(c, np.zeros(n)), dtype=np.float64) for c in COMPONENTS}
        values["one"] = np.ones(n)
        products = {
            (a, b): float(values[a] @ values[b])
            for i, a in enumerate(COMPONENTS)
            for b in COMPONENTS[i:]
        }
        return cls(cohort, n, {c: float(v.sum()) for c, v in values.items()}, products)

    def product(self, a: str, b: str) -> float:
        i, j = COMPONENTS.index(a), COMPONENTS.index(b)
        return self.products[(a, b) if i <= j else (b, a)]


@dataclass(frozen=True)
class ExperimentData:
    """What ClickHouse returned for one release's canary: both cohorts' moments and counts."""

    start: datetime
    end: datetime
    pre_start: datetime
    pre_end: datetime
    canary_version: str
    baseline_version: str
    cohorts: dict[str, CohortMoments]
    crossed_users: int  # users seen in both slots (a weight change moved them): left out


_DT = "DateTime64(3, 'UTC')"
_IN_COHORT = (
    "((slot = 'canary' AND model_version = {canary:String})"
    " OR (slot = 'baseline' AND model_version = {baseline:String}))"
)
# The pre-period reads only the cohorts' users: a day of the whole fleet's rows is not needed.
_COHORT_USERS = (
    f"user_id IN (SELECT user_id FROM inference_logs "
    f"WHERE ts >= {{start:{_DT}}} AND ts < {{end:{_DT}}} AND {_IN_COHORT})"
)


def _impressions(frm: str, to: str, cohort: str, alias: str) -> str:
    """Per user: impressions in [frm, to) and how many distinct (request, item) pairs of them
    drew a click or order (the gate's rule: one click is credited once, however often the item
    was shown), with feedback read up to an hour after the period.

    Pairs are matched by a 64-bit hash: a set of integers, not of string tuples (5x faster
    here; a collision is a 2^-64 event per pair).
    """
    where = f"ts >= {{{frm}:{_DT}}} AND ts < {{{to}:{_DT}}} AND {cohort}"
    return f"""{alias} AS (
    SELECT user_id, toFloat64(count()) AS impressions,
           toFloat64(uniqExactIf(pair, pair IN (
               SELECT cityHash64(request_id, item_id) FROM feedback
               WHERE ts >= {{{frm}:{_DT}}} AND ts < {{{to}:{_DT}}} + INTERVAL 1 HOUR
                 AND event IN ('click', 'order')))) AS clicked
    FROM (SELECT user_id, cityHash64(request_id, item_id) AS pair FROM impressions WHERE {where})
    GROUP BY user_id
)"""


_PER_USER_SQL = f"""
WITH per_user AS (
    SELECT user_id, uniqExact(slot) AS slots, toString(any(slot)) AS cohort_slot,
           toFloat64(count()) AS requests, toFloat64(sum(latency_ms)) AS latency_sum
    FROM inference_logs
    WHERE ts >= {{start:{_DT}}} AND ts < {{end:{_DT}}} AND {_IN_COHORT}
    GROUP BY user_id
),
{_impressions("start", "end", _IN_COHORT, "clicks")},
{_impressions("pre_start", "pre_end", _COHORT_USERS, "pre_clicks")},
shopping AS (
    SELECT user_id, toFloat64(sum(orders)) AS orders, toFloat64(sum(gmv)) AS gmv
    FROM user_sessions
    WHERE started_at >= {{start:{_DT}}} AND started_at < {{end:{_DT}}}
      AND cityHash64(session_id) IN (
          SELECT cityHash64(session_id) FROM inference_logs
          WHERE ts >= {{start:{_DT}}} AND ts < {{end:{_DT}}} AND {_IN_COHORT})
    GROUP BY user_id
),
pre_logs AS (
    SELECT user_id, toFloat64(count()) AS requests, toFloat64(sum(latency_ms)) AS latency_sum
    FROM inference_logs
    WHERE ts >= {{pre_start:{_DT}}} AND ts < {{pre_end:{_DT}}} AND {_COHORT_USERS}
    GROUP BY user_id
),
pre_shopping AS (
    SELECT user_id, toFloat64(sum(orders)) AS orders, toFloat64(sum(gmv)) AS gmv
    FROM user_sessions
    WHERE started_at >= {{pre_start:{_DT}}} AND started_at < {{pre_end:{_DT}}} AND {_COHORT_USERS}
    GROUP BY user_id
),
users AS (
    SELECT if(u.slots > 1, '{CROSSED}', u.cohort_slot) AS cohort, toFloat64(1) AS one,
           u.requests AS requests, u.latency_sum AS latency_sum,
           c.impressions AS impressions, c.clicked AS clicked,
           s.orders AS orders, s.gmv AS gmv,
           pl.requests AS pre_requests, pl.latency_sum AS pre_latency_sum,
           pc.impressions AS pre_impressions, pc.clicked AS pre_clicked,
           ps.orders AS pre_orders, ps.gmv AS pre_gmv
    FROM per_user AS u
    LEFT JOIN clicks AS c ON c.user_id = u.user_id
    LEFT JOIN shopping AS s ON s.user_id = u.user_id
    LEFT JOIN pre_logs AS pl ON pl.user_id = u.user_id
    LEFT JOIN pre_clicks AS pc ON pc.user_id = u.user_id
    LEFT JOIN pre_shopping AS ps ON ps.user_id = u.user_id
)
"""
# Component names come from a fixed tuple, never from input; every value is a bound parameter.
_PAIRS = [(a, b) for i, a in enumerate(COMPONENTS) for b in COMPONENTS[i:]]
_MOMENTS_SQL = (
    _PER_USER_SQL
    + "SELECT cohort, count() AS users, "
    + ", ".join(f"sum({c})" for c in COMPONENTS)
    + ", "
    + ", ".join(f"sum({a} * {b})" for a, b in _PAIRS)
    + " FROM users GROUP BY cohort ORDER BY cohort"
)


def query_experiment(
    client: Client,
    start: datetime,
    end: datetime,
    pre_start: datetime,
    canary: str,
    baseline: str,
    pre_end: datetime | None = None,
) -> ExperimentData:
    """Both cohorts' moments over [start, end), with covariates from [pre_start, pre_end).

    `pre_end` (default `start`) is the canary's deploy when [start, end) is a later step of it:
    the covariate must predate any exposure to the candidate.
    """
    pre_end = pre_end or start
    if not pre_start <= pre_end <= start < end:
        raise ValueError(
            f"need pre_start <= pre_end <= start < end, got {pre_start.isoformat()}, "
            f"{pre_end.isoformat()}, {start.isoformat()}, {end.isoformat()}"
        )
    if not canary or not baseline:
        raise ValueError(f"name both versions, got canary={canary!r} baseline={baseline!r}")
    parameters = {
        "start": start,
        "end": end,
        "pre_start": pre_start,
        "pre_end": pre_end,
        "canary": canary,
        "baseline": baseline,
    }
    rows = client.query(
        _MOMENTS_SQL, parameters=parameters, settings={"join_use_nulls": 0}
    ).result_rows
    cohorts: dict[str, CohortMoments] = {}
    crossed = 0
    width = len(COMPONENTS)
    for row in rows:
        name, users = str(row[0]), int(row[1])
        if name == CROSSED:
            crossed = users
            continue
        sums = dict(zip(COMPONENTS, (float(v) for v in row[2 : 2 + width]), strict=True))
        products = dict(zip(_PAIRS, (float(v) for v in row[2 + width :]), strict=True))
        cohorts[name] = CohortMoments(name, users, sums, products)
    return ExperimentData(start, end, pre_start, pre_end, canary, baseline, cohorts, crossed)
