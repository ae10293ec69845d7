"""Which period of a release's canary is a clean experiment, read from its release events.

Raising the canary's weight from w to w' moves the users of buckets [w, min(2w, w')) from the
baseline into the canary (serving/routing.py), so only a period at one weight keeps every user
in one cohort with equal shares and equal exposure. The experiment therefore measures the
canary's last step: from the last weight change to the promotion or rollback that ended it.
Its covariates come from the `pre_period` before the canary's first deploy, before any user
could have seen the candidate. A sample-ratio verdict the gate recorded (`invalid`) is used
instead of the estimator's own check.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.impact.experiment_types import SampleRatio
from logstore.release_events import ReleaseEvent

ENDING_KINDS = ("promote", "rollback")


@dataclass(frozen=True)
class CanaryWindow:
    """The experiment's period [start, end) at `weight` %, and its covariate period."""

    start: datetime
    end: datetime
    pre_start: datetime
    pre_end: datetime
    weight: int
    steps: int  # weight steps the canary took; all but the last are left out

    def describe(self) -> str:
        left_out = (
            f"; the {self.steps - 1} earlier step(s) are left out because raising the weight "
            "moves users from the baseline into the canary"
            if self.steps > 1
            else ""
        )
        return (
            f"measured over the canary's last step ({self.weight} % of users each in canary and "
            f"baseline, {(self.end - self.start).total_seconds() / 60:.1f} min){left_out}; "
            f"covariates from the {(self.pre_end - self.pre_start).total_seconds() / 3600:.0f} h "
            "before the canary's deploy"
        )


def _utc(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def canary_window(
    events: list[ReleaseEvent], now: datetime, pre_period: timedelta
) -> CanaryWindow | str:
    """The last step's window, or a sentence saying why this release has no experiment."""
    deploys = [e for e in events if e.kind == "deploy"]
    if not deploys:
        return "the candidate was never deployed as a canary"
    steps = [
        e for e in events
        if e.kind == "weight" and e.verdict == "passed" and int(e.details.get("weight", 0)) > 0
    ]  # fmt: skip
    if not steps:
        return "the canary never took traffic (no weight above 0 was set)"
    last = steps[-1]
    start = _utc(last.ts)
    endings = [_utc(e.ts) for e in events if e.kind in ENDING_KINDS and _utc(e.ts) >= start]
    end = endings[0] if endings else now
    if end <= start:
        return "the canary's last step ended as it began"
    deployed = _utc(deploys[0].ts)
    return CanaryWindow(
        start=start,
        end=end,
        pre_start=deployed - pre_period,
        pre_end=deployed,
        weight=int(last.details["weight"]),
        steps=len(steps),
    )


def recorded_sample_ratio(events: list[ReleaseEvent]) -> SampleRatio | None:
    """The gate's sample-ratio verdict, when it recorded one as `invalid`; else None."""
    for event in events:
        if event.verdict == "invalid":
            d = event.details
            return SampleRatio(
                canary_users=int(d.get("canary_users", 0)),
                baseline_users=int(d.get("baseline_users", 0)),
                expected_canary_share=float(d.get("expected_share", 0.5)),
                chi2=float(d.get("chi2", float("nan"))),
                p_value=float(d.get("p_value", float("nan"))),
                passed=False,
                source="release events",
                reason=f"the gate recorded {event.kind} as invalid: {event.reason}",
            )
    return None
