"""Resource names. Owns the rule: a name is `projects/{project}/{kind}/{id}` with the documented id
syntax (3..255 chars, starts with a letter, [A-Za-z0-9-_.~+%], not starting with "goog")."""

from __future__ import annotations

import re

from pigeon.core import limits
from pigeon.core.errors import InvalidArgument

DELETED_TOPIC = "_deleted-topic_"
DELETED_SCHEMA = "_deleted-schema_"
ID_CHARS = r"A-Za-z0-9\-_.~+%"  # (a regular expression's character class, shared with the OpenAPI document)
_ID = re.compile(rf"[A-Za-z][{ID_CHARS}]*\Z")
_PROJECT = re.compile(rf"[A-Za-z0-9][{ID_CHARS}:]*\Z")
PROJECT_CHARS_MAX = 100
KINDS = ("topics", "subscriptions", "snapshots", "schemas")


def check_id(resource_id: str, kind: str) -> None:
    what = kind[:-1]
    if not limits.name_chars_min <= len(resource_id) <= limits.name_chars_max:
        raise InvalidArgument(
            f"Invalid [{kind}] name: the {what} id must be between {limits.name_chars_min} and "
            f"{limits.name_chars_max} characters long (got {len(resource_id)})."
        )
    if not _ID.match(resource_id):
        raise InvalidArgument(
            f"Invalid [{kind}] name: ({resource_id}) must start with a letter and contain only letters, "
            "numbers, dashes (-), periods (.), underscores (_), tildes (~), percents (%) or plus signs (+)."
        )
    if resource_id.lower().startswith("goog"):
        raise InvalidArgument(f'Invalid [{kind}] name: ({resource_id}) must not start with "goog".')


def split(name: str, kind: str) -> tuple[str, str]:
    """Parse `projects/P/KIND/ID` into (P, ID), checking the id rules."""
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != kind or not parts[1]:
        raise InvalidArgument(
            f"Invalid [{kind}] name: ({name}) must be of the form projects/{{project}}/{kind}/{{{kind[:-1]}}}."
        )
    check_project(parts[1])
    check_id(parts[3], kind)
    return parts[1], parts[3]


def check_project(project: str) -> None:
    if not project or len(project) > PROJECT_CHARS_MAX or not _PROJECT.match(project):
        raise InvalidArgument(f"Invalid project: ({project}).")


def project_of(name: str) -> str:
    """`projects/P` → P, with checks."""
    parts = name.split("/")
    if len(parts) != 2 or parts[0] != "projects":
        raise InvalidArgument(f"Invalid [projects] name: ({name}) must be of the form projects/{{project}}.")
    check_project(parts[1])
    return parts[1]


def join(project: str, kind: str, resource_id: str) -> str:
    return f"projects/{project}/{kind}/{resource_id}"

# Reserved message attributes of Pigeon's queue extensions (settable by every stock client)
ATTR_IDEMPOTENCY_KEY = "pigeon-idempotency-key"  # publish once per key within the topic's window
ATTR_ACTIVATE_AT = "pigeon-activate-at"  # RFC 3339 time or epoch milliseconds: not delivered before
ATTR_DELAY = "pigeon-delay"  # relative form: "90", "90s", "15m", "2h", "1d"
