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

    def quota_violations(self) -> list[tuple[str, str]]:
        """(subject, description) pairs of a google.rpc.QuotaFailure detail, or none."""
        return []

    def retry_after_s(self) -> float | None:
        """A google.rpc.RetryInfo detail's delay, or None."""
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


class Unauthenticated(PigeonError):
    """A missing, malformed, expired or unverifiable credential. Says what was wrong with the credential, never
    anything about the resource asked for."""

    code, http = "UNAUTHENTICATED", 401


class PermissionDenied(PigeonError):
    """The caller is known but may not do this. The message is the same whatever the reason — missing
    permission, missing resource, another tenant's resource — so the caller learns nothing more."""

    code, http = "PERMISSION_DENIED", 403
    MESSAGE = "User not authorized to perform this action."

    def __init__(self, message: str = MESSAGE):
        super().__init__(message)


class LimitExceeded(ResourceExhausted):
    """A count quota (topics or subscriptions of a project, resources of the server) is full: a QuotaFailure
    detail names it; no RetryInfo, since only a delete makes room."""

    def __init__(self, message: str, subject: str):
        super().__init__(message)
        self.subject = subject

    def quota_violations(self) -> list[tuple[str, str]]:
        return [(self.subject, self.message)]


class QuotaExceeded(ResourceExhausted):
    """A per-project quota ran out. Carried as google.rpc.QuotaFailure (which quota, whose) and RetryInfo (when a
    retry may succeed) details."""

    def __init__(self, project: str, quota: str, limit: int, unit: str, retry_after_s: float):
        super().__init__(f"Quota exceeded for quota metric '{quota}' of project {project}: limit {limit} {unit}; "
                         f"retry after {retry_after_s:.1f} s.")
        self.project, self.quota, self.retry_after = project, quota, retry_after_s

    def quota_violations(self) -> list[tuple[str, str]]:
        return [(f"projects/{self.project}", self.message)]

    def retry_after_s(self) -> float | None:
        return self.retry_after
