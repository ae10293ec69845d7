"""Waiting on a condition, for tests and benchmarks: never a fixed sleep that hopes it is long enough.

A fixed sleep is either too short on a loaded machine (a flaky test) or too long everywhere (a
slow suite). `wait_until` polls the condition itself and returns as soon as it holds; when it
never does, the error names what was awaited and the last value seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ConditionTimeout(AssertionError):
    """The awaited condition did not hold in time (an AssertionError: a test fails on it)."""


def wait_until(check: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """The first truthy value `check()` returns within `timeout_s`; raises ConditionTimeout else."""
    if timeout_s <= 0 or interval_s <= 0:
        raise ValueError(f"timeout_s and interval_s must be > 0, got {timeout_s}, {interval_s}")
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise ConditionTimeout(f"{what}: not so after {timeout_s:g} s (last seen {value!r})")
        time.sleep(interval_s)


def poll_until(check: Callable[[], T], timeout_s: float, interval_s: float = 0.05) -> T:
    """Like `wait_until`, but returns the last value instead of raising: the caller asserts on it."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(interval_s)
    return value
