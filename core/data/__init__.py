"""Data validation rules: what a trainable window looks like, checked with Great Expectations."""
