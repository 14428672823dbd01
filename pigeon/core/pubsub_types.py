"""Pub/Sub's message types (`google.pubsub_v1.types`, the client library's: every field of today's API) without
the client library around them. Owns the rule: Pigeon's modules import the types through this one.

`import google.pubsub_v1.types` runs the package's `__init__` first, and that imports the whole generated
client — api_core, requests, urllib3, its async and REST transports — about 0.3 s of a server's start-up (of
~0.8 s) spent on code a server never runs, and the first thing a restart waits for. So the package is
registered without running its `__init__` (its submodules import as usual: `google.pubsub_v1.types`, and
`google.pubsub_v1.services.…` for the REST front's routes). What the `__init__` would have added — the client
classes re-exported at the top, such as `google.pubsub_v1.PublisherClient` — is added the first time something
asks for a name the package lacks (a process that loaded Pigeon's modules and then makes a client: a test, a
tool): the `__init__` runs then, once. A server never asks."""

from __future__ import annotations

import importlib.util
import sys

_PACKAGE = "google.pubsub_v1"

if _PACKAGE not in sys.modules:
    _spec = importlib.util.find_spec(_PACKAGE)
    _package = sys.modules[_PACKAGE] = importlib.util.module_from_spec(_spec)  # its __path__, not its __init__

    def _rest_of_the_package(name: str):
        """A name the `__init__` would have made (PEP 562: asked only when the module lacks it)."""
        if name.startswith("__") or importlib.util.find_spec(f"{_PACKAGE}.{name}") is not None:
            raise AttributeError(name)  # (a submodule: the import system asks before importing it)
        del _package.__getattr__
        _spec.loader.exec_module(_package)
        return getattr(_package, name)

    _package.__getattr__ = _rest_of_the_package

from google.pubsub_v1 import types  # noqa: E402

__all__ = ["types"]
