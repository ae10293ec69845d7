"""The shadow's pairs over a window of `shadow_pairs`, summed where the rows are.

One query returns per-user clustered sums (a user's requests are correlated: sticky routing,
one session's features) of three per-request figures: the log-latency difference shadow minus
stable of a scored pair, the shadow's error, and the top-k overlap of the two answers (the
offline parity gate's measure, `tasks.compilation.topk_overlap`: |top-k ∩ top-k| / k over
requests with more than k candidates). A second gives both sides' exact quantiles at p-h, p,
p+h for the P95 and P99 tests. Only a few dozen numbers leave the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from clickhouse_connect.driver.client import Client

_WHERE = """
    WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
      AND stable_version = {stable:String} AND candidate_version = {candidate:String}
"""

_SUMS_SQL = f"""
SELECT
    count() AS users,
    sum(n), sum(d), sum(n * n), sum(d * d), sum(n * d), sum(d_sq),
    sum(m), sum(e), sum(m * m), sum(e * e), sum(m * e),
    sum(g), sum(a), sum(g * g), sum(a * a), sum(g * a)
FROM
(
    SELECT
        user_id,
        toFloat64(countIf(shadow_error = '')) AS n,
        sumIf(log(greatest(shadow_latency_ms, 0.001)) - log(greatest(stable_latency_ms, 0.001)),
              shadow_error = '') AS d,
        sumIf(pow(log(greatest(shadow_latency_ms, 0.001))
                  - log(greatest(stable_latency_ms, 0.001)), 2), shadow_error = '') AS d_sq,
        toFloat64(count()) AS m,
        toFloat64(countIf(shadow_error != '')) AS e,
        toFloat64(countIf(shadow_error = '' AND candidates > {{k:UInt16}})) AS g,
        sumIf(length(arrayIntersect(arraySlice(stable_top_k, 1, {{k:UInt16}}),
                                    arraySlice(shadow_top_k, 1, {{k:UInt16}}))) / {{k:UInt16}},
              shadow_error = '' AND candidates > {{k:UInt16}}) AS a
    FROM shadow_pairs
    {_WHERE}
    GROUP BY user_id
)
"""

LEVELS = (0.93, 0.95, 0.97, 0.985, 0.99, 0.995)
_QUANTILES_SQL = f"""
SELECT
    quantilesExactIf{LEVELS}(stable_latency_ms, shadow_error = ''),
    quantilesExactIf{LEVELS}(shadow_latency_ms, shadow_error = '')
FROM shadow_pairs
{_WHERE}
"""


@dataclass(frozen=True)
class Clustered:
    """Per-user sums of one per-request figure x over n requests: Σn, Σx, Σn², Σx², Σnx."""

    n: float
    x: float
    n_sq: float
    x_sq: float
    cross: float


@dataclass(frozen=True)
class ShadowSums:
    """A window of pairs, stable version against candidate: what the shadow judge reads."""

    users: int
    latency: Clustered  # x = log(shadow ms) - log(stable ms), scored pairs
    latency_request_sq: float  # Σ x² over requests: the request-level variance, for the tail
    errors: Clustered  # x = the shadow failed, every pair
    agreement: Clustered  # x = top-k overlap, scored pairs with more than k candidates
    stable_quantiles_ms: tuple[float, ...]  # at LEVELS, scored pairs
    shadow_quantiles_ms: tuple[float, ...]

    @property
    def pairs(self) -> int:
        return int(self.errors.n)


def query_shadow_pairs(
    client: Client, start: datetime, end: datetime, stable: str, candidate: str, k: int
) -> ShadowSums:
    """The pairs of `stable` and `candidate` logged in [start, end), summed (agreement at top-`k`)."""
    params = {"start": start, "end": end, "stable": stable, "candidate": candidate, "k": k}
    row = client.query(_SUMS_SQL, parameters=params).result_rows[0]
    q = client.query(_QUANTILES_SQL, parameters=params).result_rows[0]
    v = [float(x or 0.0) for x in row[1:]]
    return ShadowSums(
        users=int(row[0]),
        latency=Clustered(*v[0:5]),
        latency_request_sq=v[5],
        errors=Clustered(*v[6:11]),
        agreement=Clustered(*v[11:16]),
        stable_quantiles_ms=tuple(float(x) for x in q[0]),
        shadow_quantiles_ms=tuple(float(x) for x in q[1]),
    )
