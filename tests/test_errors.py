"""``agent.errors``: the one exception → HTTP status (and gRPC code) map and the one
``Retry-After`` rounding, for every error class the node and the coordinator raise."""

import json

import pytest
from aiohttp import web

from agent.backends.base import BackendError, BackendUnavailable, InvalidInput
from agent.coordinator.catalog import CatalogError
from agent.coordinator.planner import PlanError
from agent.errors import (AgentError, error_response, grpc_code, http_status,
                          retry_after_header, retry_after_seconds)
from agent.node.admission import Shed
from agent.node.cache import (CacheBusy, CacheError, LoadFailed, ModelInUse, ModelInvalid,
                              ModelTooLarge, UnknownModel)
from agent.node.tensors import BadRequest
from agent.wire import ReportError


@pytest.mark.parametrize("exc, status, code", [
    (UnknownModel("m"), 404, "NOT_FOUND"),
    (ModelInvalid("m"), 400, "INVALID_ARGUMENT"),
    (ModelTooLarge("m"), 507, "RESOURCE_EXHAUSTED"),
    (CacheBusy("m"), 503, "UNAVAILABLE"),
    (ModelInUse("m"), 409, "FAILED_PRECONDITION"),
    (LoadFailed("m"), 503, "UNAVAILABLE"),
    (CacheError("m"), 500, "INTERNAL"),
    (Shed("m", "queue_full", 2.5), 503, "UNAVAILABLE"),
    (BackendError("m"), 500, "INTERNAL"),
    (BackendUnavailable("m"), 503, "UNAVAILABLE"),
    (InvalidInput("m"), 400, "INVALID_ARGUMENT"),
    (BadRequest("m"), 400, "INVALID_ARGUMENT"),
    (CatalogError("m"), 400, "INVALID_ARGUMENT"),
    (PlanError("m"), 409, "FAILED_PRECONDITION"),
    (ReportError("capacity", "missing"), 400, "INVALID_ARGUMENT"),
    (web.HTTPNotFound(), 404, "NOT_FOUND"),
    (web.HTTPMethodNotAllowed("POST", ["GET"]), 405, "UNIMPLEMENTED"),
    (web.HTTPUnauthorized(), 401, "UNAUTHENTICATED"),
    (ValueError("a bug, not a bad request"), 500, "INTERNAL"),
    (KeyError("x"), 500, "INTERNAL"),
    (RuntimeError("x"), 500, "INTERNAL"),
])
def test_every_error_maps_to_its_status_and_grpc_code(exc, status, code):
    assert http_status(exc) == status
    assert grpc_code(exc) == code


def test_errors_keep_their_python_kinds():
    """Re-based on AgentError, the classes still are what callers catch them as."""
    assert isinstance(InvalidInput("x"), ValueError)
    assert isinstance(BackendError("x"), RuntimeError)
    assert isinstance(CatalogError("x"), ValueError) and isinstance(PlanError("x"), ValueError)
    assert not isinstance(BackendError("x"), CacheError)
    for cls in (CacheError, BackendError, InvalidInput, CatalogError, PlanError, ReportError):
        assert issubclass(cls, AgentError)
    assert ReportError("capacity", "missing").key == "capacity"


def test_a_status_without_a_grpc_code_is_unknown():
    class Teapot(AgentError):
        status = 418
    assert http_status(Teapot()) == 418 and grpc_code(Teapot()) == "UNKNOWN"


@pytest.mark.parametrize("seconds, value", [
    (0.0, 1), (0.2, 1), (1.0, 1), (1.01, 2), (2.5, 3), (7.0, 7), (-3.0, 1)])
def test_retry_after_is_whole_seconds_rounded_up_at_least_one(seconds, value):
    assert retry_after_seconds(seconds) == value
    assert retry_after_header(seconds) == {"Retry-After": str(value)}


def test_no_retry_after_without_seconds():
    assert retry_after_header(None) == {}


def test_shed_rounds_its_retry_after_the_same_way():
    assert Shed("m", "deadline", 0.2).retry_after == 1.0
    assert Shed("m", "deadline", 1.01).retry_after == 2.0
    assert Shed("m", "deadline").retry_after == 1.0


def test_error_response_carries_status_message_and_retry_after():
    busy = error_response(Shed("queue full", "queue_full", 3.2))
    assert busy.status == 503 and busy.headers["Retry-After"] == "4"
    assert json.loads(busy.text) == {"error": "queue full"}
    down = error_response(BackendUnavailable("TF Serving restarts"))
    assert down.status == 503 and down.headers["Retry-After"] == "1"
    bad = error_response(InvalidInput("input 'X': wrong shape"))
    assert bad.status == 400 and "Retry-After" not in bad.headers
    assert json.loads(bad.text) == {"error": "input 'X': wrong shape"}
    conflict = error_response(PlanError("nothing to plan"))
    assert conflict.status == 409 and "Retry-After" not in conflict.headers
