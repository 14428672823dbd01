"""Pub/Sub's message types (`google.pubsub_v1.types`, the client library's: every field of today's API) without
the client library around them. Owns the rule: Pigeon's modules import the types through this one.

`import google.pubsub_v1.types` runs the package's `__init__` first, and that imports the whole generated
client — api_core, requests, urllib3, its async and REST transports — about 0.3 s of a server's start-up (of
~0.8 s) spent on code a server never runs, and the first thing a restart waits for. So the package is
registered without running its `__init__` (its submodules import as usual: `google.pubsub_v1.types`, and
`google.pubsub_v1.services.…` for the REST front's routes). What the `__init__` would have added — the client
classes re-exported at the top, such as `google.pubsub_v1.PublisherClient` — is not there in such a process;
nothing of the server uses them, and the clients are made in other processes."""

from __future__ import annotations

import importlib.util
import sys

_PACKAGE = "google.pubsub_v1"

if _PACKAGE not in sys.modules:
    _spec = importlib.util.find_spec(_PACKAGE)
    sys.modules[_PACKAGE] = importlib.util.module_from_spec(_spec)  # its __path__, without running __init__

from google.pubsub_v1 import types  # noqa: E402

__all__ = ["types"]
