"""The per-method SLIs of the node's APIs: every call counted once by its response code, and its latency — what
Cloud Monitoring gives Pub/Sub as `api/request_count` (label `response_code`) and `api/request_latencies`.
Owns the rules:

  * a call is recorded in one place per API: gRPC calls by `measured`, which wraps each method handler once (a
    server interceptor in effect — grpc.aio's own interceptors are not used because the hot methods taken by
    pigeon.api.takers never pass through them), REST requests by RestApi.handle, once per request with its route;
  * the hot path pays a clock read, a list index and a histogram bisect: each method's counts and histogram are
    made when its handler is wrapped, and the Prometheus families are built only at a scrape;
  * a stream (StreamingPull) counts once, when it ends, with the status it ended with (a client's cancel is
    CANCELLED; a stream ended for a drain or a shutdown, UNAVAILABLE, which the clients retry), and has no
    latency: it lasts as long as its client wants, so a duration says nothing about the service;
  * a call forwarded to its bundle's owner counts on both nodes (each served it: the first by forwarding), as
    node-to-node calls (pigeon.v1.Storage) count on the node that serves them. The error ratio is read per `api`
    over `google.pubsub.v1` methods (docs/alerts.yml); a REST request is also a gRPC call over loopback, so the
    two `api` values are never summed.

Pull's latency includes its wait for messages, as Cloud Monitoring's does."""

from __future__ import annotations

import asyncio
import time

import grpc
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from pigeon.api.access import PerMethod
from pigeon.core.histogram import Histogram

CODES = tuple(c.name for c in sorted(grpc.StatusCode, key=lambda c: c.value[0]))
INDEX = {c: c.value[0] for c in grpc.StatusCode}  # grpc.StatusCode → its number, an index into CODES
OK, CANCELLED, UNKNOWN, INTERNAL = (INDEX[c] for c in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED,
                                                       grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL))
assert CODES[OK] == "OK" and len(CODES) == 17


class Method:
    """One method's (or REST route's) counts by response code and its latency histogram (None: not timed)."""

    __slots__ = ("api", "name", "codes", "latency")

    def __init__(self, api: str, name: str, timed: bool):
        self.api, self.name = api, name
        self.codes = [0] * len(CODES)
        self.latency = Histogram() if timed else None


class Requests(Collector):
    """Every method's figures, exported at a scrape as `pigeon_request_count_total{api, method, response_code}`
    and `pigeon_request_latency_seconds{api, method}`."""

    def __init__(self):
        self.methods: dict[tuple[str, str], Method] = {}

    def method(self, api: str, name: str, timed: bool = True) -> Method:
        m = self.methods.get((api, name))
        if m is None:
            m = self.methods[api, name] = Method(api, name, timed)
        return m

    def collect(self):
        count = CounterMetricFamily("pigeon_request_count", "Calls by method and response code (a stream counts "
                                    "once, when it ends)", labels=["api", "method", "response_code"])
        latency = HistogramMetricFamily("pigeon_request_latency_seconds", "From a call's arrival to its answer "
                                        "(streams are not timed)", labels=["api", "method"])
        for m in list(self.methods.values()):
            for code, n in zip(CODES, m.codes):
                if n:
                    count.add_metric([m.api, m.name, code], n)
            if m.latency is not None and m.latency.count:
                h = m.latency.snapshot()
                latency.add_metric([m.api, m.name], [(repr(b), c) for b, c in zip(h.bounds, h.cumulative)] +
                                   [("+Inf", h.count)], h.sum)
        yield count
        yield latency


# --- gRPC --------------------------------------------------------------------------------------------------
def measured(requests: Requests, handlers: list[grpc.GenericRpcHandler]) -> list[grpc.GenericRpcHandler]:
    """`handlers`, every call of theirs recorded in `requests`."""
    return [PerMethod(h, lambda name, handler: _wrap(requests, name, handler)) for h in handlers]


def _wrap(requests: Requests, name: str, handler):
    if handler.unary_unary is not None:
        return handler._replace(unary_unary=_unary(requests.method("grpc", name), handler.unary_unary))
    if handler.stream_stream is not None:
        return handler._replace(stream_stream=_stream(requests.method("grpc", name, timed=False),
                                                      handler.stream_stream))
    raise AssertionError(f"{name}: only unary and bidirectional methods are served")


def _ended(context, e: BaseException) -> int:
    """The code a call that raised `e` ends with: its abort's, CANCELLED when it was cancelled, else UNKNOWN (what
    grpc answers for an exception)."""
    if isinstance(e, grpc.aio.AbortError):
        return INDEX.get(context.code(), UNKNOWN)
    if isinstance(e, (asyncio.CancelledError, GeneratorExit)):
        return CANCELLED
    return UNKNOWN


def _unary(m: Method, inner):
    codes, latency, clock = m.codes, m.latency, time.perf_counter

    async def call(request, context):
        t0 = clock()
        code = OK
        try:
            return await inner(request, context)
        except BaseException as e:
            code = _ended(context, e)
            raise
        finally:
            codes[code] += 1
            latency.observe(clock() - t0)

    return call


def _stream(m: Method, inner):
    codes = m.codes

    async def stream(request_iterator, context):
        code = OK
        try:
            async for resp in inner(request_iterator, context):
                yield resp
        except BaseException as e:
            code = _ended(context, e)
            raise
        finally:
            codes[code] += 1

    return stream


# --- REST --------------------------------------------------------------------------------------------------
class RestRoutes:
    """The REST routes' figures, one Method per route (`VERB template`), found by the route's identity: routes are
    made once (pigeon.api.rest_routes) and live as long as the process."""

    UNMATCHED = "(no route)"

    def __init__(self, requests: Requests):
        self.requests = requests
        self._by_route: dict[int, Method] = {}
        self.unmatched = requests.method("rest", self.UNMATCHED)

    def of(self, route) -> Method:
        if route is None:
            return self.unmatched
        m = self._by_route.get(id(route))
        if m is None:
            m = self._by_route[id(route)] = self.requests.method("rest", f"{route.verb} {route.template}")
        return m

    @staticmethod
    def record(m: Method, code: grpc.StatusCode, took_s: float) -> None:
        m.codes[INDEX[code]] += 1
        m.latency.observe(took_s)
