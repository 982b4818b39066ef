"""Tells an MLflow outage (worth queueing and retrying) from a refusal and from a bug of ours.

- `Failure.outage`: the transport or the store is down or busy: a refused or dropped connection,
  a timeout, retries used up, an HTTP 5xx, a locked or unreachable sqlite database, or an MLflow
  error code that says "try again" (TEMPORARILY_UNAVAILABLE, ...). Writes queue in the outbox.
- `Failure.refused`: MLflow answered and said no (bad parameter, missing resource, permission)
  or the artifact store cannot take the files: retrying cannot help. Surfaces as TrackingError.
- `Failure.bug`: anything else (TypeError, KeyError, ValueError, pydantic's ValidationError, ...):
  a bug in this program. It is raised as it is, never queued.
"""

from __future__ import annotations

import enum
import functools
import sqlite3

import httpx
import requests
import sqlalchemy.exc
import urllib3.exceptions

_RETRYABLE_CODES = frozenset(
    {
        "TEMPORARILY_UNAVAILABLE",
        "REQUEST_LIMIT_EXCEEDED",
        "DEADLINE_EXCEEDED",
        "INTERNAL_ERROR",
        "SERVICE_UNDER_MAINTENANCE",
        "ABORTED",
    }
)
"""MLflow error codes that mean "the service could not do it now", not "the request is wrong"."""
_OUTAGE_DB_TEXT = (
    "database is locked",
    "database table is locked",
    "unable to open database",
    "disk i/o error",
    "could not connect",
    "connection refused",
    "server closed the connection",
    "timeout expired",
)
"""Database OperationalErrors of a locked or unreachable store (sqlite, PostgreSQL), not e.g. sqlite's
"no such table"."""
_BUG_TYPES = (TypeError, ValueError, LookupError, AttributeError, NameError, AssertionError)
"""What our own code raises when it is wrong (pydantic's ValidationError is a ValueError)."""


class Failure(enum.Enum):
    outage = "outage"
    refused = "refused"
    bug = "bug"


_TRANSPORT_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.RetryError,
    requests.exceptions.ChunkedEncodingError,
    urllib3.exceptions.HTTPError,
    httpx.TransportError,
    ConnectionError,
    TimeoutError,
)
"""A connection refused, dropped or timed out, or retries used up (what MLflow's HTTP client wraps)."""
_OPERATIONAL_ERRORS = (sqlite3.OperationalError, sqlalchemy.exc.OperationalError)


@functools.cache
def _mlflow_exception() -> type[BaseException]:
    from mlflow.exceptions import MlflowException  # deferred: importing mlflow takes about 1 s

    return MlflowException


def _chain(error: BaseException) -> list[BaseException]:
    """The error, then what caused it (explicitly or while it was being handled), outermost first."""
    seen: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and not any(link is s for s in seen):
        seen.append(link)
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return seen


def _is_transport(error: BaseException) -> bool:
    if isinstance(error, _TRANSPORT_ERRORS):
        return True
    if isinstance(error, requests.HTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None)
        return status is None or status >= 500  # a 5xx is the server's trouble, a 4xx ours
    if isinstance(error, _OPERATIONAL_ERRORS):
        return any(part in str(error).lower() for part in _OUTAGE_DB_TEXT)
    return False


def classify(error: BaseException) -> Failure:
    """Whether a failed MLflow call is an outage, a refusal or a bug (module doc)."""
    if any(_is_transport(link) for link in _chain(error)):
        return Failure.outage
    if isinstance(error, _mlflow_exception()):
        cause = error.__cause__  # what MLflow wrapped on purpose (`raise ... from`)
        if isinstance(cause, _BUG_TYPES):
            return Failure.bug  # e.g. a TypeError of ours that the sqlite store turned into an error code
        if isinstance(cause, _OPERATIONAL_ERRORS):
            return Failure.refused  # a database error that is not a lock or an unreachable file
        code = getattr(error, "error_code", "")
        return Failure.outage if code in _RETRYABLE_CODES else Failure.refused
    if isinstance(error, OSError):
        return Failure.refused  # the artifact store cannot take or give the files
    return Failure.bug
