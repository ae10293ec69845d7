"""The domain core: Relay's decisions and statistics, pure and importing no Prefect.

One sub-package per concern (`gate`, `drift`, `impact`, `lineage`, ...). `tasks/` holds the thin
Prefect shells that read, call into here, and record; import-linter contracts in pyproject.toml
keep Prefect and `tasks` out of this package.
"""
