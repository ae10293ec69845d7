"""Prefect flows: wiring only. They call tasks and branch on typed verdicts."""
