"""What list and pull verbs print: `--format table` (default, for people) or `--format json` (one JSON
document for programs, field names and encodings as in Pub/Sub's REST API: camelCase, message data base64)."""

from __future__ import annotations

import base64
import json
from enum import Enum

import typer
from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.table import Table

console = Console()


class Format(str, Enum):
    table = "table"
    json = "json"


FORMAT = typer.Option(Format.table, "--format", "-f", help="table (for people) or json (one document, REST field names)")


def as_dict(message) -> dict:
    """A proto-plus or protobuf message as the REST API spells it."""
    pb = type(message).pb(message) if hasattr(type(message), "pb") else message
    return MessageToDict(pb)


def show(fmt: Format, key: str, items: list, columns: list[tuple[str, callable]]) -> None:
    """Print `items` (proto messages): as {key: [REST JSON objects]}, or as a table of `columns` (header,
    function of the item)."""
    if fmt is Format.json:
        print(json.dumps({key: [as_dict(i) for i in items]}, indent=2))
        return
    table = Table(*(header for header, _ in columns))
    for item in items:
        table.add_row(*(str(fn(item)) for _, fn in columns))
    # a terminal gets the table at its width; a pipe whole (names are never cut short with …)
    (console if console.is_terminal else Console(width=100_000)).print(table)


def text(data: bytes) -> str:
    """Message data for a table: the text when it is UTF-8, else base64 (marked)."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


RECEIVED = [
    ("message id", lambda r: r.message.message_id),
    ("data", lambda r: text(r.message.data)),
    ("attributes", lambda r: ", ".join(f"{k}={v}" for k, v in sorted(r.message.attributes.items()))),
    ("attempt", lambda r: r.delivery_attempt or ""),
    ("ack id", lambda r: r.ack_id),
]
