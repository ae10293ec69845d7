"""The SLO gate: canary vs stable latency and errors from `inference_logs`, as a typed verdict."""

from __future__ import annotations

from dataclasses import dataclass

from logstore.slo import SlotStats
from relay.types import GateResult, Verdict


@dataclass(frozen=True)
class SloThresholds:
    """Absolute SLOs, the canary's allowance relative to stable, and the evidence needed."""

    max_p95_ms: float = 300.0
    max_error_rate: float = 0.01
    max_p95_ratio: float = 1.2  # canary P95 may be at most this times stable's ...
    min_p95_delta_ms: float = 10.0  # ... unless within this many ms: at 15 ms, 1.2x is noise
    min_requests: int = 200  # per slot and window; below it nothing can be concluded
    consecutive_error_limit: int = 4  # failed queries in a row before the verdict is `error`


def _pick(stats: list[SlotStats], slot: str, version: str | None) -> SlotStats | None:
    rows = [s for s in stats if s.slot == slot and (version is None or s.model_version == version)]
    if not rows:
        return None
    return max(rows, key=lambda s: s.requests)


def assess_slo(stats: list[SlotStats], canary_version: str, limits: SloThresholds) -> GateResult:
    """passed | failed | inconclusive for one analysis window (query errors are counted elsewhere)."""
    canary = _pick(stats, "canary", canary_version)
    stable = _pick(stats, "stable", None)
    thresholds = {
        "max_p95_ms": limits.max_p95_ms,
        "max_error_rate": limits.max_error_rate,
        "max_p95_ratio": limits.max_p95_ratio,
        "min_p95_delta_ms": limits.min_p95_delta_ms,
        "min_requests": float(limits.min_requests),
    }
    measured: dict[str, float] = {"canary_requests": float(canary.requests if canary else 0)}
    if canary is not None:
        measured |= {
            "canary_p50_ms": canary.p50_ms,
            "canary_p95_ms": canary.p95_ms,
            "canary_p99_ms": canary.p99_ms,
            "canary_error_rate": canary.error_rate,
        }
    if stable is not None:
        measured |= {
            "stable_requests": float(stable.requests),
            "stable_p95_ms": stable.p95_ms,
            "stable_error_rate": stable.error_rate,
        }

    def verdict(v: Verdict, reason: str) -> GateResult:
        return GateResult(
            gate="slo", verdict=v, reason=reason, measurements=measured, thresholds=thresholds
        )

    if canary is None or canary.requests < limits.min_requests:
        got = canary.requests if canary else 0
        return verdict(
            Verdict.inconclusive,
            f"canary served {got} requests, fewer than the {limits.min_requests} needed",
        )
    failures = []
    if canary.p95_ms > limits.max_p95_ms:
        failures.append(f"canary P95 {canary.p95_ms:.1f} ms > {limits.max_p95_ms:g} ms")
    if canary.error_rate > limits.max_error_rate:
        failures.append(f"canary error rate {canary.error_rate:.2%} > {limits.max_error_rate:.2%}")
    if stable is not None and stable.requests >= limits.min_requests and stable.p95_ms > 0:
        ratio = canary.p95_ms / stable.p95_ms
        measured["p95_ratio"] = ratio
        if ratio > limits.max_p95_ratio and canary.p95_ms - stable.p95_ms > limits.min_p95_delta_ms:
            failures.append(
                f"canary P95 is {ratio:.2f}x stable's ({canary.p95_ms:.1f} vs {stable.p95_ms:.1f} ms) > {limits.max_p95_ratio:g}x"
            )
    if failures:
        return verdict(Verdict.failed, "; ".join(failures))
    return verdict(
        Verdict.passed,
        f"canary P95 {canary.p95_ms:.1f} ms, error rate {canary.error_rate:.2%} over {canary.requests} requests",
    )


def error_verdict(
    consecutive_errors: int, last_error: str, limits: SloThresholds
) -> GateResult | None:
    """`error` once queries have failed `consecutive_error_limit` times in a row, else None."""
    if consecutive_errors < limits.consecutive_error_limit:
        return None
    return GateResult(
        gate="slo",
        verdict=Verdict.error,
        reason=f"{consecutive_errors} consecutive failed log queries; last: {last_error}",
        measurements={"consecutive_errors": float(consecutive_errors)},
        thresholds={"consecutive_error_limit": float(limits.consecutive_error_limit)},
    )
