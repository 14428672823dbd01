"""Pigeon on Apache Spark: the `pigeon` data source (batch and streaming reads of a topic by per-shard
offset ranges, a cursor subscription advanced on commit, an idempotent writer) and export subscriptions.
Needs the `spark` extra: pip install 'pigeon[spark]'."""

from __future__ import annotations


def register(spark) -> None:
    """Make .format("pigeon") available in this SparkSession."""
    from pigeon.spark.source import PigeonDataSource

    spark.dataSource.register(PigeonDataSource)
