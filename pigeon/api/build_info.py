"""`pigeon_build_info{version,commit} 1` on /metrics: which build a node runs, the Prometheus convention (joined
onto other series with `* on(instance) group_left(version)`). Read once, when the node starts serving: the
commit comes from git (pigeon.version.commit), which a scrape must not wait for."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pigeon.version import __version__, commit


class BuildInfo(Collector):
    def __init__(self):
        self.labels = [__version__, commit()]

    def collect(self):
        g = GaugeMetricFamily("pigeon_build_info", "1, labelled with the version and the git commit this node runs "
                                                   "(\"unknown\" outside a checkout)", labels=["version", "commit"])
        g.add_metric(self.labels, 1)
        yield g
