"""A streaming query in its own process (its own SparkSession), so a test can kill -9 it mid-stream:
pigeon topic → Parquet files, availableNow, small micro-batches."""

from __future__ import annotations

import sys

from spark_helpers import build_session

if __name__ == "__main__":
    endpoint, topic, cursor, out, ck, max_rows = sys.argv[1:7]
    spark = build_session("local[2]")
    q = (spark.readStream.format("pigeon").option("endpoint", endpoint).option("topic", topic)
         .option("cursor", cursor).option("startingPosition", "earliest").option("maxRowsPerTrigger", max_rows)
         .load().writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
