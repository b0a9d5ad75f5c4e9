"""Typed errors. The class name is the contract: awslambdaric reports it as `errorType` on direct
invokes, and HTTP sources put it in `{"error": {"type": ...}}`."""

from __future__ import annotations


def error_body(type_name: str, message: str) -> dict[str, dict[str, str]]:
    """The one error body every HTTP answer carries: `{"error": {"type", "message"}}`."""
    return {"error": {"type": type_name, "message": message}}


def internal_error_body(error: BaseException) -> dict[str, dict[str, str]]:
    """A fault of ours (not the request's), as the body of a 500: the class and message, never a traceback."""
    return error_body("InternalError", f"{type(error).__name__}: {error}")


class WarmstartError(Exception):
    """Base of every error warmstart raises on purpose."""


class RequestError(WarmstartError):
    """The request is at fault; the instance is fine and keeps serving."""

    status = 400

    def to_body(self) -> dict[str, dict[str, str]]:
        return error_body(type(self).__name__, str(self))


class InvalidJSONError(RequestError):
    """The payload or body is not valid JSON."""


class InvalidEncodingError(RequestError):
    """The body is not valid UTF-8 (or not valid base64 where the source says it is)."""


class InvalidInputError(RequestError):
    """The JSON is fine but its shape or types are not what the task takes."""


class TooManyInputsError(RequestError):
    """More inputs in one request than `WARMSTART_MAX_INPUTS` allows."""


class InputTooLongError(RequestError):
    """An input longer than `WARMSTART_MAX_CHARS` characters."""


class PayloadTooLargeError(RequestError):
    """The request body is over Lambda's 6 MB synchronous payload limit."""

    status = 413


class ServiceBusyError(RequestError):
    """The instance's request queue is full: not the request's fault, but answered the same way (at once,
    typed, and the instance keeps serving); HTTP callers get 503 and may retry."""

    status = 503


class UnsupportedRequestError(RequestError):
    """A well-formed request this model cannot answer (wrong task, unknown method)."""


class UnsupportedEventSourceError(UnsupportedRequestError):
    """An event from a trigger warmstart does not serve (S3, SQS, SNS, DynamoDB, Kinesis, CloudWatch Logs, VPC
    Lattice, EventBridge rules other than schedules, ...): named by its shape, with what is served instead."""


class ModelLoadError(WarmstartError):
    """The packed model is missing, incomplete or corrupt; raised at init and names the file."""


class ConfigError(WarmstartError, ValueError):
    """A setting outside its closed set or range; the message lists what is valid."""


class ModelFetchError(ModelLoadError):
    """A packed model could not be fetched from S3, or what came back does not match its manifest (names the
    object, and both digests or sizes); nothing half-fetched is ever published."""


class InsufficientStorageError(ModelFetchError):
    """The cache directory (Lambda's `/tmp`) cannot hold the model; says how much is needed and free."""


class ModelRunError(ModelLoadError):
    """The packed model fails while running (at warm-up or on a request): its program raised, or asked for more
    memory than its bound. The model's fault, not the request's (a 500 naming the file and the node, at init a
    load failure); nothing is left half-done and the instance keeps serving."""


class ModelOutputError(ModelRunError):
    """The model answered NaN or an infinity: no JSON number says it (`null` would be a silent hole in a
    vector or a score), so the request gets a 500 naming the output and where; the instance keeps serving."""


class Abandoned(Exception):
    """The outcome of a request whose caller left before it ran (nobody reads it). Here, not in
    `handler.runtime.workers`, so the single-call Lambda path names it without loading the pool."""
