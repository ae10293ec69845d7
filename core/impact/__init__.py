"""Impact estimation: what latency costs in GMV, and the per-release report."""
