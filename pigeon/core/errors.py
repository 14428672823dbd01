"""Operational errors. Owns the rule: every error a client can cause is a PigeonError carrying its
gRPC status code name and HTTP status; the API boundary translates them once (api.errors)."""

from __future__ import annotations


class PigeonError(Exception):
    """Base of operational errors. `code` is the google.rpc.Code name, `http` the HTTP status."""

    code = "INTERNAL"
    http = 500

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def error_info(self) -> tuple[str, str, dict[str, str]] | None:
        """(reason, domain, metadata) of a google.rpc.ErrorInfo detail the client is given, or None."""
        return None


class InvalidArgument(PigeonError):
    code, http = "INVALID_ARGUMENT", 400


class NotFound(PigeonError):
    code, http = "NOT_FOUND", 404


class AlreadyExists(PigeonError):
    code, http = "ALREADY_EXISTS", 409


class FailedPrecondition(PigeonError):
    code, http = "FAILED_PRECONDITION", 400


class ResourceExhausted(PigeonError):
    code, http = "RESOURCE_EXHAUSTED", 429


class Unavailable(PigeonError):
    code, http = "UNAVAILABLE", 503


class Aborted(PigeonError):
    code, http = "ABORTED", 409


class Unimplemented(PigeonError):
    code, http = "UNIMPLEMENTED", 501


class AckIdFailure(InvalidArgument):
    """Exactly-once delivery: some ack ids could not be acknowledged or modified. Carried to clients as a
    google.rpc.ErrorInfo detail {reason, domain, metadata: {ack_id: failure code}}."""

    reason = "EXACTLY_ONCE_ACKID_FAILURE"
    domain = "pubsub.googleapis.com"

    def __init__(self, failures: dict[str, str]):
        super().__init__(f"Some acknowledgement ids in the request were invalid ({len(failures)} of them).")
        self.failures = failures

    def error_info(self) -> tuple[str, str, dict[str, str]]:
        return self.reason, self.domain, self.failures
