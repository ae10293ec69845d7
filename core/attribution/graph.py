"""The causal graph of one request's latency, fitted as a linear SCM, and exact Shapley shares.

    in_flight -> batch_size, queue;  rows -> input_bytes, preprocess, compute, queue, postprocess
    input_bytes, batch_size -> preprocess;  batch_size -> compute
    preprocess, compute -> queue  (the engine thread is busy with both while others wait)
    queue, preprocess, compute, postprocess -> latency

Each node with parents is a linear mechanism with additive noise (least squares with an
intercept); a root is its empirical distribution. The change in mean latency from one population
to another is split over the nodes whose mechanism changed (Budhathoki et al. 2021, "Why did
the distribution change?", the attribution DoWhy's `gcm.distribution_change` computes): v(S) is
mean latency when the nodes in S take the *after* mechanism and the rest the *before* one, and
each node's contribution is its Shapley value in v. With linear mechanisms the mean propagates
exactly (E[x] = c + b.E[parents]), so v is evaluated for all 2^9 subsets in closed form: no
Monte-Carlo draws, and the contributions sum to the observed change exactly.

Why these edges. A request waits (queue) behind the batches ahead of it, so a slower engine or
feature pipeline raises queueing too: with preprocess and compute as parents of queue, that
queueing is booked to the slower stage (the root cause), not to queue (a symptom). Offered load
(in_flight: requests in the worker when this one arrived) drives batch sizes and queueing; a
change in traffic alone is a change of that root, named as load. Bigger payloads at the same row
count are a change in input_bytes given rows; the slower parsing that follows is preprocess's
unchanged mechanism at larger inputs, so the inputs are named, not the stage they slow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TARGET = "latency_ms"
NODES = (  # topological order
    "in_flight",
    "rows",
    "input_bytes",
    "batch_size",
    "preprocess_ms",
    "compute_ms",
    "queue_ms",
    "postprocess_ms",
    TARGET,
)
PARENTS: dict[str, tuple[str, ...]] = {
    "in_flight": (),
    "rows": (),
    "input_bytes": ("rows",),
    "batch_size": ("in_flight",),
    "preprocess_ms": ("rows", "input_bytes", "batch_size"),
    "compute_ms": ("rows", "batch_size"),
    "queue_ms": ("in_flight", "rows", "preprocess_ms", "compute_ms"),
    "postprocess_ms": ("rows",),
    TARGET: ("queue_ms", "preprocess_ms", "compute_ms", "postprocess_ms"),
}
CAUSES = {  # node -> what a person calls it
    "in_flight": "offered load (requests in flight)",
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


_MASKS = _subset_masks(len(NODES))
_SIZES = _MASKS.sum(axis=1)


def _shapley_weights(n: int) -> np.ndarray:
    """w[k] = k! (n-k-1)! / n!, the weight of a subset of size k without the player."""
    from math import factorial

    return np.array([factorial(k) * factorial(n - k - 1) / factorial(n) for k in range(n)])


_WEIGHTS = _shapley_weights(len(NODES))


def subset_means(before: LinearScm, after: LinearScm) -> np.ndarray:
    """(2^n, n) mean of every node under every mix of before/after mechanisms."""
    means = np.zeros(_MASKS.shape)
    for j in range(len(NODES)):
        take_after = _MASKS[:, j]
        c = np.where(take_after, after.intercepts[j], before.intercepts[j])
        w = np.where(take_after[:, None], after.weights[j], before.weights[j])
        means[:, j] = c + np.einsum("sk,sk->s", w, means)
    return means


def shapley_contributions(before: LinearScm, after: LinearScm) -> dict[str, float]:
    """Each node's Shapley share (ms) of the change in mean latency; they sum to the change."""
    target = subset_means(before, after)[:, _INDEX[TARGET]]
    n = len(NODES)
    out = {}
    for j, node in enumerate(NODES):
        without = ~_MASKS[:, j]
        codes = np.nonzero(without)[0]
        gains = target[codes | (1 << j)] - target[codes]
        out[node] = float(np.sum(_WEIGHTS[_SIZES[codes]] * gains))
    assert n == len(out)
    return out


def contributions_ms(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """Each cause's contribution (ms) to the change in mean latency from `before` to `after`."""
    return shapley_contributions(fit_scm(before), fit_scm(after))
