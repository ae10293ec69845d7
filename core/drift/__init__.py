"""Drift analysis: live traffic against the champion's training window."""
