"""The gate benchmark's offline half: recorded rows, planted regressions, replayed releases.

`bench.gate` records real workers' rows and writes the figures; this module replays them
through the loop the release flow runs (`core.gate.plan`, `core.gate.step`, `core.gate.judge`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from core.gate.evidence import StepEvidence, StepFigures
from core.gate.judge import judge_window
from core.gate.plan import CanaryPlan, plan_canary
from core.gate.rules import CanaryRules
from core.gate.step import StepIO, run_step
from logstore.slo import cohort_sums_of, paired_seconds_of
from relay.types import GateResult, Verdict

STEPS = (5, 25, 50)
WINDOW_S = 20.0
RECORDING_COLUMNS = ("ts", "user", "latency_ms", "status")


@dataclass(frozen=True)
class Regression:
    """How a planted candidate differs from its baseline, applied to recorded rows."""

    factor: float = 1.0  # every request x factor (a uniformly slower model)
    tail_share: float = 0.0  # this share of requests ...
    tail_factor: float = 1.0  # ... x this (a cold path, a pause, a cache miss)
    user_share: float = 0.0  # this share of users (by id) ...
    user_factor: float = 1.0  # ... x this (a per-user shape: a feature slow for some users)
    load_cost: float = 0.0  # x (1 + load_cost x rps / peak rps): a cost that shows under load
    extra_errors: float = 0.0  # added 5xx share


REGRESSIONS: dict[str, Regression] = {
    "aa": Regression(),
    "uniform x1.10": Regression(factor=1.10),
    "uniform x1.25": Regression(factor=1.25),
    "uniform x1.5": Regression(factor=1.5),
    "uniform x2": Regression(factor=2.0),
    "tail 5% x5": Regression(tail_share=0.05, tail_factor=5.0),  # P95 ~x1.25 at peak
    "a tenth of users x3": Regression(user_share=0.1, user_factor=3.0),
    "load-dependent x1.5 at peak": Regression(load_cost=0.5),
    "+1pt errors": Regression(extra_errors=0.01),
}


# -- the recording ---------------------------------------------------------------------------


@dataclass
class Recording:
    """Rows the real workers logged for one slot, in time order."""

    ts: np.ndarray  # seconds
    user: np.ndarray
    latency_ms: np.ndarray
    status: np.ndarray

    @classmethod
    def of(cls, rows: list[tuple]) -> Recording:
        ts, user, latency, status = (np.asarray(c) for c in zip(*rows, strict=True))
        return cls(
            ts.astype(float), user.astype(np.int64), latency.astype(float), status.astype(int)
        )

    def sample(
        self, rng: np.random.Generator, start: float, span: float, n: int, offset: float, ids: int
    ) -> tuple[np.ndarray, ...]:
        """n rows of users drawn from the `span` seconds after `start`, re-timed into the
        WINDOW_S seconds from `offset` (a span longer than a window is compressed into it).

        A cluster bootstrap: the stretch's users are drawn with replacement, each draw bringing
        all its rows in the stretch under a fresh user id (`ids` + the draw's number), until n
        rows are taken. Replayed cohorts are so new users from the recorded population, as live
        cohorts are: a user's rows stay together (the judge's per-user clustering sees them as
        it would live), and canary and baseline never share a user, as sticky routing ensures.
        """
        lo, hi = np.searchsorted(self.ts, [start, start + span])
        if hi - lo < 1:
            lo, hi = 0, len(self.ts)
        if n <= 0:
            return tuple(
                np.empty(0, dtype=a.dtype)
                for a in (self.user, self.latency_ms, self.status, self.ts)
            )
        users, rows_of = np.unique(self.user[lo:hi], return_inverse=True)
        order = np.argsort(rows_of, kind="stable") + lo  # the stretch's rows grouped by user
        counts = np.bincount(rows_of, minlength=len(users))
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        drawn = rng.integers(0, len(users), int(np.ceil(1.5 * n / counts.mean())) + 1)
        while counts[drawn].sum() < n:  # rare: a run of light users
            drawn = np.concatenate([drawn, rng.integers(0, len(users), len(drawn))])
        sizes = counts[drawn]
        copy = np.repeat(np.arange(len(drawn)), sizes)[:n]
        within = np.arange(n) - np.repeat(np.cumsum(sizes) - sizes, sizes)[:n]
        idx = order[first[drawn[copy]] + within]
        return (
            ids + copy.astype(np.int64),
            self.latency_ms[idx],
            self.status[idx],
            (self.ts[idx] - start) * (WINDOW_S / span) + offset,
        )


@dataclass
class Load:
    """A paired recording of canary and baseline rows at one load level."""

    name: str
    canary: Recording
    baseline: Recording
    rps: float
    _pooled: Recording | None = field(default=None, repr=False)

    def draw(
        self, rng: np.random.Generator, n_canary: int, n_baseline: int, window: int
    ) -> tuple[Any, Any]:
        """n rows of each slot from one random stretch of the recording.

        Both slots come from the same stretch, so they share its load swings as canary and
        baseline do live. The stretch is a window long, or longer where a window at the replayed
        rate asks for more rows than the recording holds in one (then it is compressed into the
        window): each recorded row is drawn about once, not ten times over, so a replayed
        release at 500 req/s from a 40 req/s recording is not credited with information the
        recording never had.
        """
        pooled = self.pooled
        first, last = pooled.ts[0], pooled.ts[-1]
        per_s = len(pooled.ts) / max(last - first, 1.0)
        span = min(max(WINDOW_S, (n_canary + n_baseline) / per_s), last - first)
        start = float(rng.uniform(first, max(first, last - span)))
        offset = window * WINDOW_S  # windows follow each other in time
        ids = (2 * window + 1) << 32  # fresh ids per window and cohort: no user in both
        return (
            pooled.sample(rng, start, span, n_canary, offset, ids),
            pooled.sample(rng, start, span, n_baseline, offset, ids + (1 << 32)),
        )

    @property
    def pooled(self) -> Recording:
        """Both slots' rows in time order: canary and baseline replay draw from the same rows.

        The two recorded slots served versions of equal cost, but a minute of a contended
        host leaves their P95s apart by chance (x1.08 in one recording, beyond what the P95
        test can call equal at x1.10): replayed as they are, every "A/A" release would carry
        that chance difference and every planted regression would sit on top of it. Drawn
        from the pooled rows, an A/A release is one, and a regression is exactly what is
        planted; both cohorts still share each stretch's load swings.
        """
        if self._pooled is None:
            c, b = self.canary, self.baseline
            order = np.argsort(np.concatenate([c.ts, b.ts]), kind="stable")
            self._pooled = Recording(
                *(np.concatenate([getattr(c, k), getattr(b, k)])[order] for k in RECORDING_COLUMNS)
            )
        return self._pooled

    def summary(self) -> dict[str, float]:
        lat = np.concatenate([self.canary.latency_ms, self.baseline.latency_ms])
        return {
            "rows": int(len(lat)),
            "rps": round(self.rps, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p95_ms": round(float(np.percentile(lat, 95)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "canary_p95_ms": round(float(np.percentile(self.canary.latency_ms, 95)), 2),
            "baseline_p95_ms": round(float(np.percentile(self.baseline.latency_ms, 95)), 2),
        }


def apply(
    rows: tuple[np.ndarray, ...],
    regression: Regression,
    rng: np.random.Generator,
    load_ratio: float,
) -> tuple[np.ndarray, ...]:
    """The candidate's rows: the recorded ones shaped by the planted regression.

    `load_ratio` is this recording's rate over the peak recording's, for the load-dependent cost.
    """
    users, latency, status, ts = rows
    r = regression
    factor = np.full(len(latency), r.factor * (1 + r.load_cost * load_ratio))
    if r.tail_share:
        factor = np.where(rng.random(len(latency)) < r.tail_share, factor * r.tail_factor, factor)
    if r.user_share:
        slow_user = (users * 2654435761 % 1000) < r.user_share * 1000  # a fixed tenth of users
        factor = np.where(slow_user, factor * r.user_factor, factor)
    if r.extra_errors:
        status = np.where(rng.random(len(status)) < r.extra_errors, 500, status)
    return users, latency * factor, status, ts


def p95_ratio_at_peak(peak: Load, regression: Regression) -> float:
    """What the regression does to the P95 at the fleet's peak: the peak recording's baseline
    rows shaped by it, against themselves (so recording noise between slots does not count)."""
    rng = np.random.default_rng(0)
    b = peak.baseline
    rows = (b.user, b.latency_ms, b.status, b.ts)
    shaped = apply(rows, regression, rng, 1.0)
    ok, shaped_ok = b.status < 400, shaped[2] < 400
    return float(np.percentile(shaped[1][shaped_ok], 95) / np.percentile(b.latency_ms[ok], 95))


@dataclass
class ReleaseResult:
    outcome: str  # promoted | rolled_back | paused | refused_before_users
    windows: int  # analysis windows until the release's last verdict


def plan_for(load: Load, rps: float, rules: CanaryRules) -> CanaryPlan:
    """The plan the release would make: from the champion's recorded rows, at this rate."""
    b = load.pooled
    recent = cohort_sums_of("stable", "a", b.user, b.latency_ms, b.status, b.ts)
    return plan_canary(recent, rps, list(STEPS), WINDOW_S, rules)


@dataclass
class ReplayedStep:
    """One step's windows drawn from a recording: the StepIO that `run_step` looks through."""

    load: Load
    rps: float
    weight: int
    regression: Regression
    rng: np.random.Generator
    load_ratio: float
    first_window: int
    canary: list[tuple] = field(default_factory=list)
    baseline: list[tuple] = field(default_factory=list)

    def run_window(self) -> tuple[datetime, datetime]:
        window = self.first_window + len(self.canary)
        n = self.rng.poisson(self.rps * self.weight / 100 * WINDOW_S, 2)
        c_rows, b_rows = self.load.draw(self.rng, int(n[0]), int(n[1]), window)
        self.canary.append(apply(c_rows, self.regression, self.rng, self.load_ratio))
        self.baseline.append(b_rows)
        at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=window * WINDOW_S)
        return at, at + timedelta(seconds=WINDOW_S)

    def read(self, *_: datetime) -> StepFigures:
        canary = tuple(np.concatenate(x) for x in zip(*self.canary, strict=True))
        baseline = tuple(np.concatenate(x) for x in zip(*self.baseline, strict=True))
        return StepFigures(
            cohort_sums_of("canary", "b", *canary),
            cohort_sums_of("baseline", "a", *baseline),
            paired_seconds_of(canary, baseline),
        )


def replay_release(
    load: Load,
    rps: float,
    regression: Regression,
    rules: CanaryRules,
    plan: CanaryPlan,
    rng: np.random.Generator,
    load_ratio: float,
) -> ReleaseResult:
    """Steps 5/25/50 through `core.gate.step.run_step`, the loop the flow runs, on replayed rows."""
    if not plan.reachable:  # the release asks a person before any traffic moves
        return ReleaseResult("paused", 0)
    windows = 0
    for weight in STEPS:
        replayed = ReplayedStep(load, rps, weight, regression, rng, load_ratio, windows + 1)
        step = plan.step(weight)
        length = step.length(rules) if step is not None else None
        io = StepIO(replayed.run_window, replayed.read, lambda: [])
        gate = run_step(io, rules, weight, length)[-1]
        windows += len(replayed.canary)
        if gate.verdict is Verdict.failed:
            return ReleaseResult("rolled_back", windows)
        if gate.verdict is not Verdict.passed:
            return ReleaseResult("paused", windows)
    return ReleaseResult("promoted", windows)


def anchored_rules(peak: Load) -> CanaryRules:
    """Default rules anchored as a release anchors them after its capacity check: `tolerance_ms`
    counted against the champion's P95 at the peak (here the peak recording's baseline rows)."""
    ok = peak.baseline.status < 400
    return CanaryRules(peak_p95_ms=round(float(np.percentile(peak.baseline.latency_ms[ok], 95)), 3))


def operating_characteristic(loads: list[Load], releases: int, seed: int) -> list[dict[str, Any]]:
    """One row per load x rate x regression: what share of releases ended which way, and when.

    The rules are the defaults with `peak_p95_ms` where the release flow sets it: the champion's
    P95 at the fleet's peak (`anchored_rules`), which the capacity check measures first."""
    peak = max(loads, key=lambda x: x.rps)
    rules = anchored_rules(peak)
    cases = []
    for load in loads:
        for rps in (50.0, 500.0):
            plan = plan_for(load, rps, rules)
            for name, regression in REGRESSIONS.items():
                rng = np.random.default_rng([seed, len(cases)])
                started = time.perf_counter()
                results = [
                    replay_release(load, rps, regression, rules, plan, rng, load.rps / peak.rps)
                    for _ in range(releases)
                ]
                outcomes = [r.outcome for r in results]
                cases.append(
                    {
                        "load": load.name,
                        "traffic_rps": rps,
                        "regression": name,
                        "p95_ratio_at_peak": round(p95_ratio_at_peak(peak, regression), 3),
                        "releases": releases,
                        **{
                            k: outcomes.count(k) / releases
                            for k in ("rolled_back", "refused_before_users", "paused", "promoted")
                        },
                        "median_s_to_verdict": float(
                            np.median([r.windows for r in results]) * WINDOW_S
                        ),
                        "plan": plan.summary,
                        "seconds": round(time.perf_counter() - started, 1),
                    }
                )
                print(json.dumps(cases[-1]))
    return cases


# -- the split check -------------------------------------------------------------------------


def split_check(peak: Load, replays: int, seed: int, max_windows: int = 10) -> dict[str, Any]:
    """How soon the sample-ratio check flags a 5 % canary served 6 %, and how often an even split.

    Each window brings 500 req/s x WINDOW_S requests of fresh users from the peak recording, as
    every other replay here does (`Load.draw`: a cluster bootstrap of one random stretch, each
    drawn user with all its rows under a new id), and routes them by the workers' own bucket
    function (`serving.routing.route_bucket`) with a fresh salt per replay: buckets 0-4 canary,
    5-9 baseline, the rest stable (A/A), or 0-5 canary, 6-10 baseline (the canary takes 6 %).
    Each window judges the step so far. Until 2026-12-07 every window re-drew requests of the
    recording's own users (about 8,900 in its 16,706 rows), so after a window or two no new user
    arrived and the check's evidence, which is counted in users, stopped growing: live traffic
    keeps bringing users the check has not seen.
    """
    from serving.routing import route_bucket

    rules = CanaryRules()
    rng = np.random.default_rng(seed)
    out: dict[str, list[int | None]] = {"skewed": [], "aa": []}
    users_in_2_windows: list[int] = []
    for kind, canary_buckets in (("skewed", 6), ("aa", 5)):
        for replay in range(replays):
            salt = f"bench-srm-{kind}-{replay}"
            taken: list[tuple[np.ndarray, ...]] = []
            flagged_at = None
            for window in range(max_windows):
                rows, _ = peak.draw(rng, int(rng.poisson(500 * WINDOW_S)), 0, window)
                ids, inverse = np.unique(rows[0], return_inverse=True)  # this window's new users
                bucket = np.array([route_bucket(int(u), salt) for u in ids])[inverse]
                taken.append((*rows, bucket))
                user, latency, status, ts, bucket = (
                    np.concatenate(c) for c in zip(*taken, strict=True)
                )
                if window == 1:
                    users_in_2_windows.append(len(np.unique(user)))
                slot = np.where(
                    bucket < canary_buckets, 0, np.where(bucket < canary_buckets + 5, 1, 2)
                )
                cohorts = []
                for i, name in enumerate(("canary", "baseline", "stable")):
                    m = slot == i
                    cohorts.append(
                        cohort_sums_of(name, name, user[m], latency[m], status[m], ts[m])
                    )
                gate = _judge_split(StepFigures(cohorts[0], cohorts[1], stable=cohorts[2]), rules)
                if gate.verdict is Verdict.invalid:
                    flagged_at = window + 1
                    break
            out[kind].append(flagged_at)
    detected = [w for w in out["skewed"] if w is not None]
    return {
        "traffic_rps": 500.0,
        "requests_per_window": 500.0 * WINDOW_S,
        "replays": replays,
        "max_windows": max_windows,
        "windows_to_detect": float(np.median(detected)) if detected else None,
        "windows_to_detect_p90": float(np.percentile(detected, 90)) if detected else None,
        "detected_within_2_windows": sum(1 for w in detected if w <= 2) / replays,
        "detected_within_max_windows": len(detected) / replays,
        "aa_flag_rate": sum(w is not None for w in out["aa"]) / replays,
        # what the check counts: users (requests of one user are one unit of evidence)
        "users_in_2_windows_median": float(np.median(users_in_2_windows))
        if users_in_2_windows
        else None,
        "method": "Dirichlet-multinomial on users (Lindon & Malek 2022) and clustered request "
        f"shares, their combined p (Bonferroni over the two) < {rules.srm_p:g}, cumulative over "
        "the step, one look per window; fresh users every window (cluster bootstrap of the peak "
        "recording)",
    }


def _judge_split(figures: StepFigures, rules: CanaryRules) -> GateResult:
    return judge_window(figures, rules, StepEvidence(), weight=5)[0]


def save_loads(loads: list[Load], path: Path) -> None:
    arrays = {}
    for load in loads:
        arrays[f"{load.name}.rps"] = np.array([load.rps])
        for slot in ("canary", "baseline"):
            rec = getattr(load, slot)
            for col in ("ts", "user", "latency_ms", "status"):
                arrays[f"{load.name}.{slot}.{col}"] = getattr(rec, col)
    np.savez_compressed(path, **arrays)


def read_loads(path: Path) -> list[Load]:
    data = np.load(path)
    names = sorted({k.split(".")[0] for k in data.files}, key=["light", "heavy"].index)
    return [
        Load(
            name,
            *(
                Recording(
                    *(
                        data[f"{name}.{slot}.{col}"]
                        for col in ("ts", "user", "latency_ms", "status")
                    )
                )
                for slot in ("canary", "baseline")
            ),
            float(data[f"{name}.rps"][0]),
        )
        for name in names
    ]
