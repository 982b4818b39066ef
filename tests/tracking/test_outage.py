"""Which failed MLflow calls are outages (queued), refusals (TrackingError) and bugs (raised).

The errors are built the way MLflow 3.17 raises them: its HTTP client wraps the transport's error
while handling it, its sqlite store wraps a database error `from` it.
"""

from __future__ import annotations

import sqlite3

import httpx
import pydantic
import pytest
import requests
import sqlalchemy.exc
import urllib3.exceptions
from mlflow.exceptions import MlflowException, RestException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE

from orchestrator.tracking.outage import Failure, classify


def _wrapped_while_handling(inner: BaseException, outer: BaseException) -> BaseException:
    """`outer` raised inside `except inner` (implicit chaining, as MLflow's http_request does)."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 (the implicit chain is the point)
    except BaseException as e:
        return e


def _wrapped_from(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        raise outer from inner
    except BaseException as e:
        return e


def _http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status}", response=response)


def _db_error(text: str) -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError(text))


def _validation_error() -> pydantic.ValidationError:
    try:
        pydantic.TypeAdapter(int).validate_python("x")
    except pydantic.ValidationError as e:
        return e
    raise AssertionError("unreachable")


CASES = [
    # outages: the server or the store is away or busy
    (
        "refused connection via http_request",
        _wrapped_while_handling(
            requests.ConnectionError("Connection refused"),
            MlflowException("API request to http://127.0.0.1:1/api failed with exception ..."),
        ),
        Failure.outage,
    ),
    ("timeout", _wrapped_from(requests.Timeout("read timed out"), MlflowException("timeout")), Failure.outage),
    (
        "retries used up",
        _wrapped_while_handling(requests.exceptions.RetryError("too many 503"), MlflowException("failed")),
        Failure.outage,
    ),
    ("urllib3 protocol error", urllib3.exceptions.ProtocolError("reset"), Failure.outage),
    ("httpx transport", httpx.ConnectError("refused"), Failure.outage),
    ("socket refused", ConnectionRefusedError(111, "refused"), Failure.outage),
    ("artifact upload 502", _http_error(502), Failure.outage),
    (
        "server says unavailable",
        RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy"}),
        Failure.outage,
    ),
    ("server 500", RestException({"error_code": "INTERNAL_ERROR", "message": "oops"}), Failure.outage),
    (
        "sqlite locked",
        _wrapped_from(_db_error("database is locked"), MlflowException("locked", error_code=TEMPORARILY_UNAVAILABLE)),
        Failure.outage,
    ),
    ("sqlite file gone", _db_error("unable to open database file"), Failure.outage),
    ("postgres down", _db_error("could not connect to server: Connection refused"), Failure.outage),
    # refusals: MLflow answered no, or the artifact store cannot take the files
    ("run not found", RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no run"}), Failure.refused),
    ("bad parameter", MlflowException("too long", error_code=INVALID_PARAMETER_VALUE), Failure.refused),
    ("artifact upload 403", _http_error(403), Failure.refused),
    ("disk full", OSError(28, "No space left on device"), Failure.refused),
    (
        "schema problem",
        _wrapped_from(_db_error("no such table: runs"), MlflowException("db", error_code=TEMPORARILY_UNAVAILABLE)),
        Failure.refused,
    ),
    # bugs: ours, raised as they are
    ("type error", TypeError("unsupported operand"), Failure.bug),
    ("key error", KeyError("sweep.status"), Failure.bug),
    ("value error", ValueError("bad"), Failure.bug),
    ("validation error", _validation_error(), Failure.bug),
    (
        "our TypeError wrapped by the sqlite store",
        _wrapped_from(TypeError("float() argument must be a string"), MlflowException("x", error_code=INTERNAL_ERROR)),
        Failure.bug,
    ),
]


@pytest.mark.parametrize(("error", "failure"), [(e, f) for _, e, f in CASES], ids=[c[0] for c in CASES])
def test_classify(error: BaseException, failure: Failure) -> None:
    assert classify(error) is failure
