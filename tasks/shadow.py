"""The shadow stage: the candidate scores a share of stable's requests before any user sees it.

After the canary and its baseline are loaded at weight 0 (`tasks.canary.deploy_canary`) and
before the first weight, every worker mirrors `ShadowRules.share` of stable's answered requests
to the canary slot (`serving.shadow`, leased and renewed each window); each window the pairs
logged so far are judged (`core.gate.shadow.judge_shadow`, the SQL in `logstore.shadow`) until
the verdict is `passed` or `failed`, or `max_windows` pass; then the shadow is turned off.

`failed` (or `error`: the candidate is not in its slot, workers stop answering, the log store
keeps failing) ends the release as `refused` before any weight: the flow raises it inside the
transaction, so the deploy's hook takes the canary out as it takes out a rejected one.
`inconclusive` (too few pairs, a full mirror queue, workers too old for the shadow) goes on to
the canary steps. A `passed` shadow does not shorten them: its pairs compare the candidate with
stable on the same requests and do not enter the canary's confidence sequences (see
core.gate.shadow).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from core.gate.rules import CanaryRules, ShadowRules
from core.gate.shadow import (
    SHADOW_METHOD,
    MirrorCounts,
    ShadowEvidence,
    judge_shadow,
    shadow_unavailable,
)
from logstore.release_events import EventKind
from logstore.shadow import query_shadow_pairs
from relay.settings import Settings
from relay.types import GateResult, Release, Verdict
from serving.fleet import FleetClient, FleetResult
from tasks.canary import record
from tasks.canary_analysis import LOG_STORE_ERRORS, reader
from tasks.tracing import traced

DECIDED = (Verdict.passed, Verdict.failed, Verdict.error)


def _counts(state: FleetResult) -> MirrorCounts:
    shadows = [w.state.get("shadow", {}) for w in state.workers if w.ok]
    return MirrorCounts(
        sum(int(s.get("mirrored", 0)) for s in shadows),
        sum(int(s.get("dropped", 0)) for s in shadows),
    )


def _since(now: MirrorCounts, then: MirrorCounts) -> MirrorCounts:
    # A worker restarted mid-stage starts its counts again: never below zero.
    return MirrorCounts(max(now.mirrored - then.mirrored, 0), max(now.dropped - then.dropped, 0))


def _on_look(settings: Settings, release: Release, window: int, gate: GateResult) -> None:
    record(
        settings,
        release,
        EventKind.shadow_window,
        gate.verdict,
        gate.reason,
        window=window,
        method=gate.method,
        measurements=gate.measurements,
        thresholds=gate.thresholds,
    )


@task(name="shadow-candidate", cache_policy=NO_CACHE)
@traced("shadow candidate")
def shadow_candidate(
    settings: Settings, release: Release, stable: str, rules: ShadowRules, gate: CanaryRules
) -> GateResult:
    """The shadow stage's verdict: mirror, judge each window until decided, turn it off."""
    if not rules.enabled:
        off = GateResult(
            gate="shadow",
            verdict=Verdict.inconclusive,
            reason="shadow stage off (shadow.enabled=false): the canary steps judge alone",
        )
        _on_look(settings, release, 0, off)
        return off
    lease_s = settings.serving_canary_lease_s
    with FleetClient.from_settings(settings) as fleet:
        on = fleet.set_shadow(rules.share, rules.max_queue, lease_s)
        refused = shadow_unavailable([(w.url, w.status, w.error, w.detail) for w in on.workers])
        if refused is not None:
            fleet.stop_shadow()
            _on_look(settings, release, 0, refused)
            return refused
        try:
            looks = _judge_windows(settings, fleet, release, stable, rules, gate)
        finally:
            fleet.stop_shadow()
    create_table_artifact(
        key="shadow",
        table=[
            {"look": i, "verdict": g.verdict.value, **g.measurements, "reason": g.reason}
            for i, g in enumerate(looks, 1)
        ],
        description=f"Shadow of {release.version} against stable {stable}: one row per look, "
        f"cumulative. Method: {SHADOW_METHOD}.",
    )
    return looks[-1]


def _judge_windows(
    settings: Settings,
    fleet: FleetClient,
    release: Release,
    stable: str,
    rules: ShadowRules,
    gate: CanaryRules,
) -> list[GateResult]:
    """Each window's look at the pairs so far, until one decides or `max_windows` pass."""
    start, base = datetime.now(UTC), _counts(fleet.state())
    evidence, looks, failed_queries = ShadowEvidence(), [], 0
    for window in range(1, rules.max_windows + 1):
        time.sleep(rules.window_s)  # the fleet serves its traffic; a share is mirrored
        renewed = fleet.set_shadow(rules.share, rules.max_queue, settings.serving_canary_lease_s)
        counts = _since(_counts(renewed), base)
        time.sleep(2 * settings.serving_log_flush_ms / 1000)  # the window's pairs written out
        try:
            sums = query_shadow_pairs(
                reader(settings),
                start,
                datetime.now(UTC),
                stable,
                release.version,
                rules.agreement_k,
            )
        except LOG_STORE_ERRORS as exc:
            failed_queries += 1
            if failed_queries < gate.consecutive_error_limit:
                continue
            look = GateResult(
                gate="shadow",
                verdict=Verdict.error,
                reason=f"{failed_queries} failed pair queries in a row: {exc}",
            )
        else:
            failed_queries = 0
            look, evidence = judge_shadow(sums, counts, rules, gate, evidence)
        if not renewed.ok and look.verdict is not Verdict.failed:
            look = look.model_copy(
                update={
                    "verdict": Verdict.error,
                    "reason": f"workers stopped answering the shadow: {renewed.reason}",
                }
            )
        _on_look(settings, release, window, look)
        looks.append(look)
        if look.verdict in DECIDED:
            return looks
    if not looks:
        looks.append(GateResult(gate="shadow", verdict=Verdict.inconclusive, reason="no look"))
    last = looks[-1]
    looks[-1] = last.model_copy(
        update={"reason": f"still undecided after {rules.max_windows} windows: {last.reason}"}
    )
    return looks
