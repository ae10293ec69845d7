"""The split itself: are canary, baseline and stable getting the shares they were configured for?

A routing bug or a sticky-cohort skew (a canary getting 8 % when asked for 5 %) biases every
comparison the judge makes, and nothing in latency or errors shows it. So each look compares the
observed shares with the configured weights, two ways, both valid at every look of the step:

- **Users** (the unit routing assigns): the Dirichlet-multinomial sequential test of Lindon &
  Malek, "Anytime-Valid Inference for Multinomial Count Data" (NeurIPS 2022), the sequential
  sample-ratio-mismatch check Optimizely and Eppo run. With null shares θ and a Dirichlet(c θ)
  mixture over the alternative, the Bayes factor after counts x (n in all) is

      BF = Γ(c) / Γ(c + n) · Π Γ(c θ_i + x_i) / Γ(c θ_i) / Π θ_i^x_i,

  a nonnegative martingale under the null, so p = min(1, 1 / max BF so far) is valid however
  often it is looked at. Each user's slot is fixed for the step, so the step's distinct users
  per slot are such a multinomial sample.
- **Requests** (what the comparisons weigh): a user's requests all land in one slot, so they
  are not a multinomial sample. Each slot's request share is tested against its weight with the
  normal-mixture confidence sequence of `core.gate.sequential`, its variance by the delta
  method over users (Deng et al. 2018), Bonferroni over the slots tested.

The look's p-value is the smaller of the two, doubled (Bonferroni over the two tests,
`combined_p`): each test alone is valid at its level, so flagging on either one at 0.001 would
flag an even split up to twice that often. A combined p below `CanaryRules.srm_p` (GrowthBook's
0.001) makes the look `invalid`: the weights are held and a person asked, never a promotion or
rollback on biased data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.gate.sequential import Estimate, always_valid_p
from logstore.slo import CohortSums

# the mixture's total weight c: a 5 % share's prior sd ~0.7 pt, the size of skew sought
CONCENTRATION = 1000.0
RELATIVE_SKEW = 0.2  # the request test's mixture scale: a share 20 % off its weight


@dataclass(frozen=True)
class SplitCheck:
    """Observed against expected shares, and the always-valid p-values of both tests."""

    slots: tuple[str, ...]
    expected: tuple[float, ...]
    user_shares: tuple[float, ...]
    request_shares: tuple[float, ...]
    p_users: float
    p_requests: float

    @property
    def p_value(self) -> float:
        return combined_p(self.p_users, self.p_requests)

    def describe(self) -> str:
        parts = [
            f"{slot} {u:.2%} of users and {r:.2%} of requests (expected {e:.2%})"
            for slot, e, u, r in zip(
                self.slots, self.expected, self.user_shares, self.request_shares, strict=True
            )
        ]
        return (
            f"{'; '.join(parts)}; always-valid p={self.p_users:.3g} on users (Dirichlet-"
            f"multinomial), p={self.p_requests:.3g} on requests (clustered by user)"
        )


def combined_p(p_users: float, p_requests: float) -> float:
    """The split's p-value from its two always-valid tests: Bonferroni over the two."""
    return min(1.0, 2 * min(p_users, p_requests))


def expected_shares(weight: int, slots: tuple[str, ...]) -> tuple[float, ...]:
    """Each present slot's configured share at this canary weight, renormalised over them."""
    configured = {"canary": weight / 100, "baseline": weight / 100, "stable": 1 - 2 * weight / 100}
    raw = [configured[s] for s in slots]
    total = sum(raw)
    return tuple(r / total for r in raw)


def multinomial_log_bf(counts: list[float], null: tuple[float, ...]) -> float:
    """log of the Dirichlet-multinomial Bayes factor against the null shares (Lindon & Malek)."""
    n = sum(counts)
    alphas = [CONCENTRATION * t for t in null]
    log_bf = math.lgamma(CONCENTRATION) - math.lgamma(CONCENTRATION + n)
    for x, a, t in zip(counts, alphas, null, strict=True):
        log_bf += math.lgamma(a + x) - math.lgamma(a) - x * math.log(t)
    return log_bf


def share_shift(mine: CohortSums, everyone: list[CohortSums], expected: float) -> Estimate:
    """One slot's request share minus its expected share, with its per-user delta variance."""
    total = sum(c.requests for c in everyone)
    users = sum(c.users for c in everyone)
    if total <= 0 or users < 2:
        return Estimate(math.nan, math.inf)
    share = mine.requests / total
    # Σ over users of (r_u 1[mine] - share r_u)²: (1-share)² Σ r_u² in mine, share² elsewhere
    spread = sum(
        (1 - share) ** 2 * c.by_user.rr if c is mine else share**2 * c.by_user.rr for c in everyone
    )
    return Estimate(share - expected, users / (users - 1) * spread / (total * total))


def check_split(
    cohorts: dict[str, CohortSums], weight: int, previous_log_bf: float = -math.inf
) -> tuple[SplitCheck, float]:
    """The look's split check, and the largest log Bayes factor so far (carried to the next look).

    `cohorts` holds the slots present over the step (canary and baseline, and stable when it
    serves at this weight).
    """
    slots = tuple(s for s in ("canary", "baseline", "stable") if s in cohorts)
    if weight >= 50:  # stable takes nobody: its stragglers are not part of the split
        slots = tuple(s for s in slots if s != "stable")
    expected = expected_shares(weight, slots)
    chosen = [cohorts[s] for s in slots]
    users = [float(c.users) for c in chosen]
    requests = [c.requests for c in chosen]
    log_bf = max(previous_log_bf, multinomial_log_bf(users, expected))
    p_users = 1.0 if log_bf <= 0 else math.exp(-log_bf)
    tested = list(zip(chosen, expected, strict=True))[: len(chosen) - 1]  # the last is implied
    p_requests = 1.0
    for c, e in tested:
        shift = share_shift(c, chosen, e)
        p = always_valid_p(shift, max(RELATIVE_SKEW * min(e, 1 - e), 1e-4)) * len(tested)
        p_requests = min(p_requests, p, 1.0)
    check = SplitCheck(
        slots,
        expected,
        tuple(u / sum(users) if sum(users) else math.nan for u in users),
        tuple(r / sum(requests) if sum(requests) else math.nan for r in requests),
        p_users,
        p_requests,
    )
    return check, log_bf
