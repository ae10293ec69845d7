"""Served impressions joined with feedback: labelled events shaped exactly like `events`.

An impression is labelled clicked when any click or order for its (request id, item) arrived;
otherwise 0, so feedback still in flight reads as "not clicked": callers leave a label delay
before `end` (LABEL_DELAY). An item shown twice in one feed has its feedback credited to its
top-ranked showing only, so one click never becomes two labels. `position` is the rank the serving model's scores gave the item,
which is where the shopper saw it and what the ground-truth position bias acts on; seeded events
mean the same by it. Feedback whose (request id, item) no impression has (an unsampled request,
a request served outside the window, a client's mistake) is kept in `feedback` and counted
(`feedback_counts`), never joined to anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd
from clickhouse_connect.driver.client import Client

from logstore.events import EVENT_COLUMNS
from relay.features import FEATURE_NAMES, LABEL

LABEL_DELAY = timedelta(minutes=1)  # feedback later than this after its impression is rare here

_SELECTED = ", ".join(
    "toUInt8(least(i.rank, 255)) AS position" if name == "position" else f"i.{name} AS {name}"
    for name in FEATURE_NAMES
)
# Column names come from fixed tuples, never from input; values are bound parameters. Feedback
# is read from `start` on: it never precedes its impression.
_LABELLED_FROM = f"""
SELECT i.ts AS ts, i.session_id AS session_id, {_SELECTED},
       toUInt8(f.clicks + f.orders > 0
               AND i.rank = min(i.rank) OVER (PARTITION BY i.request_id, i.item_id)) AS {LABEL}
FROM impressions AS i
LEFT JOIN (
    SELECT request_id, item_id, countIf(event = 'click') AS clicks, countIf(event = 'order') AS orders
    FROM feedback WHERE ts >= {{start:DateTime64(3, 'UTC')}}
    GROUP BY request_id, item_id
) AS f ON i.request_id = f.request_id AND i.item_id = f.item_id
WHERE i.ts >= {{start:DateTime64(3, 'UTC')}} AND i.ts < {{end:DateTime64(3, 'UTC')}}
"""
_WINDOW_SQL = _LABELLED_FROM + "ORDER BY ts, user_id"
_SAMPLE_SQL = _LABELLED_FROM + "ORDER BY cityHash64(i.request_id, i.rank) LIMIT {rows:UInt32}"
_COUNT_SQL = """
SELECT count(),
       countIf((request_id, item_id) IN (
           SELECT request_id, item_id FROM impressions
           WHERE ts >= {start:DateTime64(3, 'UTC')} - INTERVAL 1 DAY
             AND ts < {end:DateTime64(3, 'UTC')})),
       countIf(event = 'click'), countIf(event = 'order'), sum(order_value)
FROM feedback
WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
"""
_FEATURES_SQL = (
    f"SELECT ts, session_id, {', '.join(FEATURE_NAMES)} FROM impressions "
    "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} "
    "ORDER BY cityHash64(request_id, rank) LIMIT {rows:UInt32}"
)
_IMPRESSIONS_SQL = """
SELECT count() FROM impressions
WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
"""


@dataclass(frozen=True)
class FeedbackCounts:
    """What arrived in a window: feedback events, how many matched an impression, the rest."""

    impressions: int
    events: int
    matched: int
    clicks: int
    orders: int
    order_value: float

    @property
    def unmatched(self) -> int:
        return self.events - self.matched


def read_labelled_window(client: Client, start: datetime, end: datetime) -> pd.DataFrame:
    """Every impression with start <= ts < end as a labelled event (EVENT_COLUMNS), oldest first."""
    frame = client.query_df(_WINDOW_SQL, parameters={"start": start, "end": end})
    if frame.empty:  # an empty result carries no columns; give callers the real shape
        return pd.DataFrame({name: pd.Series(dtype="float64") for name in EVENT_COLUMNS})
    return frame[list(EVENT_COLUMNS)]


def sample_labelled_window(
    client: Client, start: datetime, end: datetime, rows: int
) -> pd.DataFrame:
    """Up to `rows` labelled events of [start, end), a deterministic sample by a content hash."""
    frame = client.query_df(_SAMPLE_SQL, parameters={"start": start, "end": end, "rows": rows})
    return frame[list(EVENT_COLUMNS)] if not frame.empty else frame


def sample_impressions(client: Client, start: datetime, end: datetime, rows: int) -> pd.DataFrame:
    """Up to `rows` impressions of [start, end): the features the model saw, with ts and session."""
    frame = client.query_df(_FEATURES_SQL, parameters={"start": start, "end": end, "rows": rows})
    if frame.empty:
        columns = ("ts", "session_id", *FEATURE_NAMES)
        return pd.DataFrame({name: pd.Series(dtype="float64") for name in columns})
    return frame


def feedback_counts(client: Client, start: datetime, end: datetime) -> FeedbackCounts:
    """Feedback of [start, end) and whether each matched an impression (of up to a day before)."""
    parameters = {"start": start, "end": end}
    events, matched, clicks, orders, value = client.query(
        _COUNT_SQL, parameters=parameters
    ).result_rows[0]
    impressions = client.query(_IMPRESSIONS_SQL, parameters=parameters).result_rows[0][0]
    return FeedbackCounts(
        impressions=int(impressions),
        events=int(events),
        matched=int(matched),
        clicks=int(clicks),
        orders=int(orders),
        order_value=float(value or 0.0),
    )


# Per-user sums of impressions (n) and clicked impressions (k) of the canary and its baseline:
# a user's impressions are correlated (one shopper, sticky routing), so the judge clusters by
# user, and only a handful of numbers per slot leave the database. "Clicked" is the labelled
# events' rule: any click or order on the (request, item), credited to its top-ranked showing.
_CLICK_COHORTS_SQL = """
SELECT slot, model_version, count() AS users, sum(n) AS impressions, sum(k) AS clicked,
       sum(n * n) AS nn, sum(k * k) AS kk, sum(n * k) AS nk
FROM (
    SELECT slot, model_version, user_id, toFloat64(count()) AS n, toFloat64(sum(clicked)) AS k
    FROM (
        SELECT i.slot AS slot, i.model_version AS model_version, i.user_id AS user_id,
               toUInt8(f.events > 0
                       AND i.rank = min(i.rank) OVER (PARTITION BY i.request_id, i.item_id))
                   AS clicked
        FROM impressions AS i
        LEFT JOIN (
            SELECT request_id, item_id, countIf(event IN ('click', 'order')) AS events
            FROM feedback WHERE ts >= {start:DateTime64(3, 'UTC')} GROUP BY request_id, item_id
        ) AS f ON i.request_id = f.request_id AND i.item_id = f.item_id
        WHERE i.ts >= {start:DateTime64(3, 'UTC')} AND i.ts < {end:DateTime64(3, 'UTC')}
          AND ((i.slot = 'canary' AND i.model_version = {canary:String})
               OR (i.slot = 'baseline' AND i.model_version = {baseline:String}))
    )
    GROUP BY slot, model_version, user_id
)
GROUP BY slot, model_version
"""


@dataclass(frozen=True)
class ClickSums:
    """One slot's impressions over a period, summed per user: the click-through sample."""

    slot: str
    model_version: str
    users: int
    impressions: float
    clicked: float  # impressions with a click or order
    nn: float  # Σ n_u² (impressions per user)
    kk: float  # Σ k_u² (clicked impressions per user)
    nk: float  # Σ n_u k_u

    @property
    def rate(self) -> float:
        return self.clicked / self.impressions if self.impressions else float("nan")


def query_click_cohorts(
    client: Client, start: datetime, end: datetime, canary: str, baseline: str
) -> dict[str, ClickSums]:
    """Click sums of the canary (`canary` version) and baseline slots over [start, end), by slot."""
    rows = client.query(
        _CLICK_COHORTS_SQL,
        parameters={"start": start, "end": end, "canary": canary, "baseline": baseline},
    ).result_rows
    return {
        str(r[0]): ClickSums(str(r[0]), str(r[1]), int(r[2]), *(float(x) for x in r[3:]))
        for r in rows
    }
