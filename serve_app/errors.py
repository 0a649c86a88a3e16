"""Typed exceptions for everything that can go wrong in a request.

Deployments and the engine raise these; only the router turns them into HTTP answers
(``serve_app.http.errors``). Each class carries the wire triple of the contract
(status, type, code) and the offending ``param`` when there is one.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base class: an error with a contract-shaped wire form."""

    status_code: int = 500
    error_type: str = "server_error"
    code: str | None = "server_error"
    default_message: str = "The server had an error while processing your request."

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.param = param
        self.headers = headers or {}
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


class InvalidRequestError(ServiceError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_value"
    default_message = "The request is invalid."


class ContextLengthExceededError(InvalidRequestError):
    code = "context_length_exceeded"

    @classmethod
    def for_limit(cls, context_length: int, param: str = "messages") -> ContextLengthExceededError:
        return cls(
            f"You exceeded the maximum context length for this model of {context_length}. "
            "Please reduce the length of the messages or completion.",
            param=param,
        )


class AuthenticationError(ServiceError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"
    default_message = (
        "Incorrect API key provided. Pass a valid key as 'Authorization: Bearer <API_KEY>'."
    )


class AccountError(ServiceError):
    status_code = 402
    error_type = "account_error"
    code = "account_error"
    default_message = "Your account is inactive or its quota is exhausted."


class ModelNotFoundError(ServiceError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"
    default_message = "The model does not exist or you do not have access to it."

    def __init__(self, model: str | None = None, **kwargs) -> None:
        message = kwargs.pop("message", None) or (
            f"The model '{model}' does not exist or you do not have access to it."
            if model is not None
            else None
        )
        kwargs.setdefault("param", "model")
        super().__init__(message, **kwargs)


class NotFoundError(ServiceError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"
    default_message = "Unknown path."


class RequestTooLargeError(ServiceError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"
    default_message = "The request body exceeds the size limit."


class RequestTimeoutError(ServiceError):
    status_code = 408
    error_type = "invalid_request_error"
    code = "request_timeout"
    default_message = "The request body did not arrive in time."


class UnprocessableRequestError(ServiceError):
    """A decision request that validated but cannot be answered (422 on /v1/decisions)."""

    status_code = 422
    error_type = "invalid_request_error"
    code = "invalid_value"

    @classmethod
    def from_invalid(cls, error: InvalidRequestError) -> UnprocessableRequestError:
        """The decision endpoint answers 422 where the others answer 400 (api-spec.md 7.1)."""
        converted = cls(error.message, param=error.param, headers=error.headers)
        converted.code = error.code
        return converted


class RateLimitError(ServiceError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_reached"
    default_message = "Rate limit reached. Please retry after the time in the Retry-After header."


class ServerError(ServiceError):
    """Anything unexpected. Its message never reaches a client (see ``serve_app.http.errors``)."""


class UpstreamBadResponseError(ServiceError):
    status_code = 502
    code = "bad_gateway"
    default_message = "The model component returned an invalid response."


class UpstreamUnavailableError(ServiceError):
    status_code = 503
    code = "service_unavailable"
    default_message = "The model component is unavailable or overloaded. Please retry."


class UpstreamTimeoutError(ServiceError):
    status_code = 504
    code = "timeout"
    default_message = "The model component timed out."
