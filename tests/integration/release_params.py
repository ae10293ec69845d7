"""Small-data release parameters shared by the scenario and deployment tests."""

from datetime import UTC, datetime

END = datetime(2026, 7, 1, tzinfo=UTC)

SMALL_RELEASE = {
    "window_days": 7.0,
    "epochs": 3,
    "batch_size": 512,
    "min_rows": 5_000,
    "canary_steps": [50],
    # The canary gate runs its default rules (confidence, tolerances, min_requests); only the
    # amount of test traffic is small. 60 req/s in 8 s windows gives each cohort ~240 requests a
    # window: an equal canary reaches "no regression beyond tolerance" in ~3-5 windows.
    "analysis_window_s": 8.0,
    "max_windows_per_step": 8,
    "traffic_rps": 60.0,
    "approval_timeout_s": 120,
    "impact_report_after": False,
    "tensorrt_wait_s": 0,
}
