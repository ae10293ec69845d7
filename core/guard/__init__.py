"""The release guard's rules: the champion's live SLO, the quality rule, and the guard's verdict."""
