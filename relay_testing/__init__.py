"""Real Relay objects for tests and benchmarks, built without Prefect, MLflow or a server.

Not a production path: releases build versions through the flow. Tests and `bench/` import
from here so that both measure and check the same thing.
"""
