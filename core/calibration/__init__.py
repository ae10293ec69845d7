"""The blessing: calibration of a candidate against floors and the last blessed version."""
