"""The exception tree. Every message carries the context an on-call engineer needs."""


class RelayError(Exception):
    """Base of every error Relay raises on purpose."""


class ConfigError(RelayError):
    """A setting is missing or malformed."""


class LogStoreError(RelayError):
    """ClickHouse could not be reached or a query failed."""


class StoreError(RelayError):
    """The model store refused or failed an operation."""


class IntegrityError(StoreError):
    """A blob's bytes do not hash to the name it is stored under."""


class BlobMissing(StoreError):
    """A manifest references a blob that is not in the store."""


class VersionExists(StoreError):
    """A write-once version already exists with different content."""


class VersionNotFound(StoreError):
    """No manifest for the requested version or alias."""


class GateFailed(RelayError):
    """A gate (data validation, parity, calibration, SLO) refused to let the release continue."""


class DataValidationFailed(GateFailed):
    """The training window failed its expectation suite."""


class ParityFailed(GateFailed):
    """No compiled engine matched the PyTorch reference within tolerance."""


class ServingError(RelayError):
    """A serving worker refused or failed an operation."""
