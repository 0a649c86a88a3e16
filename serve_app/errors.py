"""Typed exceptions for everything that can go wrong in a request.

Deployments and the engine raise these; only the router turns them into HTTP answers
(``serve_app.http.errors``). Each class carries the wire triple of the contract
(status, type, code), the headers every answer of it carries, and the offending ``param``
when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar


class ServiceError(Exception):
    """Base class: an error with a contract-shaped wire form."""

    status_code: int = 500
    error_type: str = "server_error"
    code: str | None = "server_error"
    default_message: str = "The server had an error while processing your request."
    # Headers every answer of this class carries (e.g. Retry-After on a 503); an instance's
    # ``headers`` argument adds to them and wins where both name the same header.
    default_headers: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(
        cls,
        *,
        status: int | None = None,
        type: str | None = None,  # the contract's name for the field (shadows the builtin here)
        code: str | None = None,
        message: str | None = None,
        headers: Mapping[str, str] | None = None,
        **kwargs,
    ) -> None:
        """A subclass declares its wire form in its class line, e.g.
        ``class Gone(ServiceError, status=410, code="gone", message="...")``; what it leaves
        out it inherits."""
        super().__init_subclass__(**kwargs)
        for name, value in (
            ("status_code", status),
            ("error_type", type),
            ("code", code),
            ("default_message", message),
            ("default_headers", headers),
        ):
            if value is not None:
                setattr(cls, name, value)

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.param = param
        self.headers = {**self.default_headers, **(headers or {})}
        super().__init__(self.message)

    def __reduce__(self):
        """Pickle across Ray processes with every attribute (message, param, headers, and a
        ``code`` set on the instance), whatever a subclass's ``__init__`` takes."""
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[ServiceError], args: tuple, state: dict) -> ServiceError:
    error = Exception.__new__(cls, *args)  # not cls(...): subclasses' __init__ signatures differ
    error.args = args
    error.__dict__.update(state)
    return error


class InvalidRequestError(
    ServiceError,
    status=400,
    type="invalid_request_error",
    code="invalid_value",
    message="The request is invalid.",
):
    """A request the contract refuses: a bad value, or too large for the model."""


class ContextLengthExceededError(
    InvalidRequestError,
    code="context_length_exceeded",
):
    @classmethod
    def for_limit(cls, context_length: int, param: str = "messages") -> ContextLengthExceededError:
        return cls(
            f"You exceeded the maximum context length for this model of {context_length}. "
            "Please reduce the length of the messages or completion.",
            param=param,
        )


class AuthenticationError(
    ServiceError,
    status=401,
    type="authentication_error",
    code="invalid_api_key",
    message="Incorrect API key provided. Pass a valid key as 'Authorization: Bearer <API_KEY>'.",
):
    """No key, or one that is unknown or revoked."""


class AccountError(
    ServiceError,
    status=402,
    type="account_error",
    code="account_error",
    message="Your account is inactive or its quota is exhausted.",
):
    """The account is inactive or has used its quota."""


class ModelNotFoundError(
    ServiceError,
    status=404,
    type="invalid_request_error",
    code="model_not_found",
    message="The model does not exist or you do not have access to it.",
):
    def __init__(self, model: str | None = None, **kwargs) -> None:
        message = kwargs.pop("message", None) or (
            f"The model '{model}' does not exist or you do not have access to it."
            if model is not None
            else None
        )
        kwargs.setdefault("param", "model")
        super().__init__(message, **kwargs)


class NotFoundError(
    ServiceError,
    status=404,
    type="invalid_request_error",
    code="not_found",
    message="Unknown path.",
):
    """A path the API does not have."""


class RequestTooLargeError(
    ServiceError,
    status=413,
    type="invalid_request_error",
    code="request_too_large",
    message="The request body exceeds the size limit.",
):
    """A body over the configured size limit."""


class RequestTimeoutError(
    ServiceError,
    status=408,
    type="invalid_request_error",
    code="request_timeout",
    message="The request body did not arrive in time.",
):
    """A body that did not finish arriving in time."""


class UnprocessableRequestError(
    ServiceError,
    status=422,
    type="invalid_request_error",
    code="invalid_value",
):
    """A decision request that validated but cannot be answered (422 on /v1/decisions)."""

    @classmethod
    def from_invalid(cls, error: InvalidRequestError) -> UnprocessableRequestError:
        """The decision endpoint answers 422 where the others answer 400 (api-spec.md 7.1)."""
        converted = cls(error.message, param=error.param, headers=error.headers)
        converted.code = error.code
        return converted


class MergeFailedError(
    ServiceError,
    status=422,
    type="invalid_request_error",
    code="merge_failed",
    message=(
        "The update snippet could not be merged without losing code: a chunk of it could not "
        "be placed in the original. Include a few unchanged lines around each change."
    ),
):
    """Apply: the update cannot be placed, or an answer failed the check (docs/apply.md);
    raised with a message that names the chunk and what failed."""


class RateLimitError(
    ServiceError,
    status=429,
    type="rate_limit_error",
    code="rate_limit_reached",
    message="Rate limit reached. Please retry after the time in the Retry-After header.",
    headers={"Retry-After": "1"},  # the message promises the header; a refusal may say longer
):
    """Over the account's request or token rate, or its concurrency cap."""


class ServerError(ServiceError):
    """Anything unexpected. Its message never reaches a client (see ``serve_app.http.errors``)."""


class UpstreamBadResponseError(
    ServiceError,
    status=502,
    code="bad_gateway",
    message="The model component returned an invalid response.",
):
    """A model deployment answered something other than its answer type."""


class UpstreamUnavailableError(
    ServiceError,
    status=503,
    code="service_unavailable",
    message="The model component is unavailable or overloaded. Please retry.",
    headers={"Retry-After": "1"},
):
    """A deployment is down, overloaded, or could not finish the request. Always retryable,
    so the answer says when: ``Retry-After`` (a lost replica's work goes to another one, or
    to its replacement, within seconds)."""


class UpstreamTimeoutError(
    ServiceError,
    status=504,
    code="timeout",
    message="The model component timed out.",
):
    """The request ran past its deadline."""
