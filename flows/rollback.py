"""rollback: put the previous blessed version (or a named blessed one) back in front of users."""

from __future__ import annotations

from prefect import flow
from prefect.runtime import flow_run

from relay.errors import GateFailed
from relay.settings import get_settings
from relay.types import Release
from tasks.rollback import choose_rollback_target, roll_back_champion


@flow(name="rollback", log_prints=True)
def rollback(
    target_version: str | None = None,
    reason: str = "manual rollback from the Prefect UI",
    actor: str = "on-call",
) -> Release:
    """Serve the target as stable on every worker, take any canary out, move champion back."""
    settings = get_settings()
    target = choose_rollback_target(settings, target_version, f"rollback-{flow_run.id}")
    if target is None:
        raise GateFailed("no previous blessed version to roll back to: name a target_version")
    roll_back_champion(settings, target, reason, actor)
    print(f"rolled back to {target.version}: {reason}")
    return target
