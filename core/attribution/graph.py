"""The causal graph of one request's latency, fitted as a linear SCM, and exact Shapley shares.

    load_rps -> batch_size, queue;  rows -> input_bytes, preprocess, compute, queue, postprocess
    input_bytes, batch_size -> preprocess;  batch_size -> compute
    ahead_rows -> ahead_input_bytes -> ahead_preprocess;  ahead_rows -> ahead_compute
    batch_size -> ahead_preprocess, ahead_compute
    load_rps -> preprocess, compute, postprocess, ahead_preprocess, ahead_compute
    ahead_preprocess, ahead_compute -> queue
    queue, preprocess, compute, postprocess -> latency

`ahead_*` are the means over the 16 requests that arrived just before this one: the work it
queues behind. `load_rps` is the arrival rate in the 250 ms around this arrival: the offered
load (logstore.stage_samples).

Each node with parents is a linear mechanism with additive noise (least squares with an
intercept); a root is its empirical distribution. The change in mean latency from one population
to another is split over the causes whose mechanisms changed (Budhathoki et al. 2021, "Why did
the distribution change?", the attribution DoWhy's `gcm.distribution_change` computes): v(S) is
mean latency when the causes in S take the *after* mechanisms and the rest the *before* ones,
and each cause's contribution is its Shapley value in v. A cause is a player that may own two
nodes: compute is a request's own engine time and that of the requests ahead of it, because a
slower engine slows both (likewise preprocess, and rows: heavier requests ahead queue this one).
With linear mechanisms the mean propagates exactly (E[x] = c + b.E[parents]), so v is evaluated
for all 2^9 subsets in closed form: no Monte-Carlo draws, and the contributions sum to the
observed change exactly.

Why these edges. Waiting (queue) is the symptom of the work ahead and of the offered load, so it
has them as parents: a slower engine's queueing is booked to compute, heavier neighbours' to
rows, more traffic's to load, and only a change in how waiting follows from those (smaller
batches, a scheduling stall) to queue itself. Offered load is the arrival rate, not the number
in flight: in flight grows with latency (Little's law), so it is partly a symptom. Load is also
a parent of every stage's time: the stages are CPU work on cores that the worker's event loop,
its log writer and (on a small host) the clients share, so each stage runs slower when more
requests arrive. Without those edges more traffic appeared as a change in the stages' own
mechanisms: the bench's load-only case named postprocess beside load (32 % of the change,
2026-12-07), a cause nobody planted. Bigger payloads
at the same row count are a change in input_bytes given rows; the slower parsing that follows is
preprocess's unchanged mechanism at larger inputs, so the inputs are named, not the stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from logstore.stage_samples import STAGE_COLUMNS

TARGET = "latency_ms"
# Topological order: the columns the sampling query returns (logstore.stage_samples), target last.
NODES = STAGE_COLUMNS
PARENTS: dict[str, tuple[str, ...]] = {
    "load_rps": (),
    "rows": (),
    "ahead_rows": (),
    "input_bytes": ("rows",),
    "ahead_input_bytes": ("ahead_rows",),
    "batch_size": ("load_rps",),
    "preprocess_ms": ("rows", "input_bytes", "batch_size", "load_rps"),
    "compute_ms": ("rows", "batch_size", "load_rps"),
    "ahead_preprocess_ms": ("ahead_rows", "ahead_input_bytes", "batch_size", "load_rps"),
    "ahead_compute_ms": ("ahead_rows", "batch_size", "load_rps"),
    "queue_ms": ("load_rps", "rows", "ahead_preprocess_ms", "ahead_compute_ms"),
    "postprocess_ms": ("rows", "load_rps"),
    TARGET: ("queue_ms", "preprocess_ms", "compute_ms", "postprocess_ms"),
}
PLAYER_OF = {  # node -> the cause whose change it is
    **{node: node for node in NODES},
    "ahead_rows": "rows",
    "ahead_input_bytes": "input_bytes",
    "ahead_preprocess_ms": "preprocess_ms",
    "ahead_compute_ms": "compute_ms",
}
PLAYERS = tuple(dict.fromkeys(PLAYER_OF[node] for node in NODES))
CAUSES = {  # player -> what a person calls it
    "load_rps": "offered load (requests/s)",
    "rows": "request size (rows)",
    "input_bytes": "input bytes",
    "batch_size": "batch size",
    "queue_ms": "queue",
    "preprocess_ms": "preprocess",
    "compute_ms": "compute",
    "postprocess_ms": "postprocess",
    TARGET: "unexplained",  # latency beyond what its stages account for
}
_INDEX = {node: i for i, node in enumerate(NODES)}


@dataclass(frozen=True)
class LinearScm:
    """Per node: an intercept and one coefficient per parent (a root: its mean, no parents)."""

    intercepts: np.ndarray  # (len(NODES),)
    weights: np.ndarray  # (len(NODES), len(NODES)); weights[j, k]: effect of node k on node j


def fit_scm(data: np.ndarray) -> LinearScm:
    """Least-squares mechanisms for every node of `data` (rows x NODES, in NODES' order)."""
    n_nodes = len(NODES)
    intercepts = np.zeros(n_nodes)
    weights = np.zeros((n_nodes, n_nodes))
    for j, node in enumerate(NODES):
        parents = [_INDEX[p] for p in PARENTS[node]]
        y = data[:, j]
        if not parents:
            intercepts[j] = y.mean()
            continue
        x = data[:, parents]
        # Centred fit: the intercept makes the fitted mean equal the sample mean exactly, and
        # lstsq's minimum-norm answer keeps a parent that does not vary (a constant load) at 0.
        mx = x.mean(axis=0)
        coef, *_ = np.linalg.lstsq(x - mx, y - y.mean(), rcond=None)
        weights[j, parents] = coef
        intercepts[j] = y.mean() - mx @ coef
    return LinearScm(intercepts, weights)


def _subset_masks(n: int) -> np.ndarray:
    """(2^n, n) booleans: row s says which nodes take the *after* mechanism in subset s."""
    codes = np.arange(2**n)
    return ((codes[:, None] >> np.arange(n)) & 1).astype(bool)


_PLAYER_MASKS = _subset_masks(len(PLAYERS))  # (2^players, players)
_SIZES = _PLAYER_MASKS.sum(axis=1)
# (2^players, nodes): whether each node takes the after mechanism in each subset of players
_MASKS = _PLAYER_MASKS[:, [PLAYERS.index(PLAYER_OF[node]) for node in NODES]]


def _shapley_weights(n: int) -> np.ndarray:
    """w[k] = k! (n-k-1)! / n!, the weight of a subset of size k without the player."""
    from math import factorial

    return np.array([factorial(k) * factorial(n - k - 1) / factorial(n) for k in range(n)])


_WEIGHTS = _shapley_weights(len(PLAYERS))


def subset_means(before: LinearScm, after: LinearScm) -> np.ndarray:
    """(2^players, nodes): mean of every node under every mix of before/after mechanisms."""
    means = np.zeros(_MASKS.shape)
    for j in range(len(NODES)):
        take_after = _MASKS[:, j]
        c = np.where(take_after, after.intercepts[j], before.intercepts[j])
        w = np.where(take_after[:, None], after.weights[j], before.weights[j])
        means[:, j] = c + np.einsum("sk,sk->s", w, means)
    return means


def shapley_contributions(before: LinearScm, after: LinearScm) -> dict[str, float]:
    """Each cause's Shapley share (ms) of the change in mean latency; they sum to the change."""
    target = subset_means(before, after)[:, _INDEX[TARGET]]
    out = {}
    for j, player in enumerate(PLAYERS):
        codes = np.nonzero(~_PLAYER_MASKS[:, j])[0]  # the subsets without this player
        gains = target[codes | (1 << j)] - target[codes]
        out[player] = float(np.sum(_WEIGHTS[_SIZES[codes]] * gains))
    return out


def contributions_ms(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """Each cause's contribution (ms) to the change in mean latency from `before` to `after`."""
    return shapley_contributions(fit_scm(before), fit_scm(after))
