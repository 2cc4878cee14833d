"""The two ways a request cannot be served from the latest results (app.py maps them to 503 and 400)."""

from __future__ import annotations


class NoResults(Exception):
    """No good analysis yet: the API answers 503."""

    def __init__(self, detail: str, last_error: str | None, retry_after: float) -> None:
        super().__init__(detail)
        self.detail, self.last_error, self.retry_after = detail, last_error, retry_after


class CostError(Exception):
    """A cost request that cannot be served with this configuration (400)."""
