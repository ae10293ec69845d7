"""Flow tests run real flows against Prefect's test harness (see tests/conftest.py)."""
