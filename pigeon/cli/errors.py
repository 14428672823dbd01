"""How the command line fails: one line on stderr in gcloud's manner, a non-zero exit, a traceback only with
--debug. The server explains a refusal in one sentence; the CLI passes that sentence on and adds nothing.

Exit codes: 1 the server refused (the line names the status), 2 the command line itself is wrong (typer's
usage errors), 3 no server answers at the address."""

from __future__ import annotations

import os
import sys

import grpc

from pigeon.core import limits

SERVER_REFUSED, USAGE, UNREACHABLE = 1, 2, 3
_GROUPS = ("topics", "subscriptions", "queue", "cluster")


class Unreachable(Exception):
    def __init__(self, address: str):
        super().__init__(address)
        self.address = address


def debugging(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("PIGEON_DEBUG", "") not in ("", "0")


def check_reachable(address: str, auth=None) -> None:
    """Fail fast (Unreachable) when nothing answers at `address`: the client libraries would retry for a
    minute in silence. (`auth`: a secured server's ClientAuth, so the TLS handshake is part of the answer.)"""
    from pigeon.client.access import channel as open_channel

    channel = open_channel(address, auth)
    try:
        grpc.channel_ready_future(channel).result(timeout=limits.cli_connect_s_max)
    except grpc.FutureTimeoutError:
        raise Unreachable(address) from None
    finally:
        channel.close()


_GLOBAL_VALUED = ("--tls-ca", "--ca-file", "--token", "--token-file", "--client-cert", "--client-key")


def verb(argv: list[str]) -> str:
    """`pigeon topics create` from the arguments (the words before the first option or operand, after the global
    options such as `--tls-ca CA`)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in _GLOBAL_VALUED else 1
    words = [a for a in argv[i:i + 2] if not a.startswith("-")]
    if words and words[0] in _GROUPS:
        return "pigeon " + " ".join(words[:2])
    return "pigeon " + words[0] if words else "pigeon"


def describe(e: BaseException) -> tuple[str, int] | None:
    """(one line, exit code) for a failure the server or the network explained, or None (a bug)."""
    from google.api_core import exceptions as gexc

    if isinstance(e, Unreachable):
        return (f"cannot reach a Pigeon server at {e.address} (no answer within {limits.cli_connect_s_max:g} s). "
                "Start one with `make run` or `pigeon serve`, or point --address or PUBSUB_EMULATOR_HOST at a "
                "running server."), UNREACHABLE
    if isinstance(e, gexc.RetryError) and e.cause is not None:
        return describe(e.cause)
    if isinstance(e, gexc.GoogleAPICallError):
        code = e.grpc_status_code.name if e.grpc_status_code is not None else str(e.code)
        if code == "UNAVAILABLE":
            return f"UNAVAILABLE: the server went away or refused the connection: {e.message}", UNREACHABLE
        return f"{code}: {e.message}", SERVER_REFUSED
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        code = e.code().name
        return f"{code}: {e.details()}", UNREACHABLE if code == "UNAVAILABLE" else SERVER_REFUSED
    return None


def run(app, argv: list[str]) -> int:
    """Run the typer app; turn the failures people make into one line, and exit codes."""
    args = [a for a in argv if a != "--debug"]
    return guard(argv, lambda: app(args, prog_name="pigeon", standalone_mode=True))


def guard(argv: list[str], call) -> int:
    """Run `call()` for the command line `argv`; turn the failures people make into one line, and exit codes."""
    debug = debugging(argv)
    args = [a for a in argv if a != "--debug"]
    try:
        call()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)  # a sentence (as `serve` gives when recovery stops): say it, as Python would
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 — the one boundary of the command line
        if debug:
            raise
        line, code = describe(e) or (f"{type(e).__name__}: {e} — unexpected; --debug shows where it happened.",
                                     SERVER_REFUSED)
        print(f"ERROR: ({verb(args)}) {line}", file=sys.stderr)
        return code
    return 0
