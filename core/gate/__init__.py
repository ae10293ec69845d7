"""The canary gate: sequential tests, window judging, the canary plan."""
