"""The one error type of the apex build: its message names the cause and the fix."""


class ApexError(RuntimeError):
    """Apex cannot be provided as configured; str(error) says why and what to do."""
