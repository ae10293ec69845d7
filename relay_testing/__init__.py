"""Real Relay objects for tests and benchmarks: versions built without Prefect, MLflow or a
server (`versions`), and a deployed local stack started by `make up`'s own scripts
(`deployed_stack`).

Not a production path: releases build versions through the flow. Tests and `bench/` import
from here so that both measure and check the same thing.
"""
