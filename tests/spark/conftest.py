"""One SparkSession for the whole session (local[2], UI off, 2 shuffle partitions, loopback only), with
the `pigeon` data source registered; tests drive the real server process through it."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")
pytest.importorskip("pyarrow", reason="the spark extra is not installed")

from spark_helpers import Node, build_session  # noqa: E402


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    s = build_session(warehouse=str(tmp_path_factory.mktemp("warehouse")))
    yield s
    s.stop()


@pytest.fixture
def node(server_factory):
    n = Node(server_factory())
    yield n
    n.close()
