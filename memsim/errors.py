"""The one error type a user sees for anything they wrote wrong."""

from __future__ import annotations


class ConfigError(ValueError):
    """A file, flag or field that is not of the expected form.

    The message names where the input came from (``file``), which field is wrong
    (``field``) and what was expected, so that the CLI can print it on one line.
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None) -> None:
        self.file = file
        self.field = field
        self.reason = message
        where = ": ".join(part for part in (file, field) if part)
        super().__init__(f"{where}: {message}" if where else message)


class CapacityError(ConfigError):
    """A workload whose tensors do not fit the tiers its layout allows."""

    def __init__(self, message: str, *, shortfall_bytes: int, file: str | None = None,
                 field: str | None = None) -> None:
        self.shortfall_bytes = shortfall_bytes
        super().__init__(message, file=file, field=field)
