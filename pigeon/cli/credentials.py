"""The command line's options for reaching a secured node, defined once. The global ones (`pigeon --tls-ca CA
--token-file F VERB …`, or PIGEON_CA_FILE, PIGEON_TOKEN, PIGEON_TOKEN_FILE, PIGEON_CLIENT_CERT, PIGEON_CLIENT_KEY)
serve every command that calls a node; `pigeon probe` and `pigeon export` take the same options after their name
too, and what is given there wins (a token or token file there replaces the global one). Owns the rule: a bad
setting (a file that cannot be read, a token given twice, a certificate without its key) is a usage error —
one line, exit 2 — found before anything is called; settings nobody uses (`pigeon serve`) are never read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:  # imported when used: the official client it brings along is not every command's
    from pigeon.client.access import ClientAuth

_OPTIONS = {  # name: (flags, environment variable of the global option, help)
    "ca_file": (("--tls-ca", "--ca-file"), "PIGEON_CA_FILE", "a secured node: TLS, verifying the server with this "
                                                            "CA (PEM)"),
    "token": (("--token",), "PIGEON_TOKEN", "a secured node: the bearer token (or an OIDC/JWT access token)"),
    "token_file": (("--token-file",), "PIGEON_TOKEN_FILE", "a secured node: the bearer token in this file"),
    "cert_file": (("--client-cert",), "PIGEON_CLIENT_CERT", "a secured node under mutual TLS: this client "
                                                            "certificate (PEM) …"),
    "key_file": (("--client-key",), "PIGEON_CLIENT_KEY", "… and its key"),
}


def option(name: str, *, env: bool = False):
    """The typer option `name` of _OPTIONS: with its environment variable for the global one (env=True)."""
    flags, var, text = _OPTIONS[name]
    return typer.Option(None, *flags, envvar=var if env else None, show_envvar=env, help=text)


CA, TOKEN, TOKEN_FILE, CERT, KEY = (option(n) for n in _OPTIONS)  # a command's own

# the global options as given (main's callback): (ca_file, token, token_file, cert_file, key_file)
_global: tuple[Optional[str], ...] = (None,) * 5
_made: dict[tuple, ClientAuth | None] = {}


def remember(ca_file: Optional[str], token: Optional[str], token_file: Optional[str], cert_file: Optional[str],
             key_file: Optional[str]) -> None:
    global _global
    _global = (ca_file, token, token_file, cert_file, key_file)


def settings(ca_file: Optional[str] = None, token: Optional[str] = None, token_file: Optional[str] = None,
             cert_file: Optional[str] = None, key_file: Optional[str] = None) -> tuple[Optional[str], ...]:
    """A command's own options over the global ones: (ca_file, token, token_file, cert_file, key_file)."""
    g_ca, g_token, g_token_file, g_cert, g_key = _global
    if not (token or token_file):
        token, token_file = g_token, g_token_file
    if not (cert_file or key_file):
        cert_file, key_file = g_cert, g_key
    return ca_file or g_ca, token, token_file, cert_file, key_file


def client_auth(ca_file: Optional[str] = None, token: Optional[str] = None, token_file: Optional[str] = None,
                cert_file: Optional[str] = None, key_file: Optional[str] = None) -> ClientAuth | None:
    """The access a command uses (`settings`); None for plaintext."""
    from pigeon.client.access import ClientAuth

    given = settings(ca_file, token, token_file, cert_file, key_file)
    if given not in _made:
        try:
            _made[given] = ClientAuth.from_files(*given)
        except ValueError as e:
            typer.echo(f"pigeon: {e}", err=True)
            raise typer.Exit(2) from None
    return _made[given]
