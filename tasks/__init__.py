"""One module per release stage: pure functions that decide and compute, thin @task shells for I/O."""
