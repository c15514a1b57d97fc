"""Batch jobs over the broker's store, run on Spark through PySpark.

Owns the nightly orphan audit (DESIGN §7, spec §4.7.3 and §17.7): ``schemas`` (what is read),
``store`` (which database, as a JDBC target), ``session`` (the SparkSession and its JDBC jars),
``readers`` (partitioned JDBC reads), ``transforms`` (pure DataFrame -> DataFrame checks),
``outputs`` (report, Parquet, Prometheus textfile, published atomically) and ``jobs`` (entry
points that do the I/O).

Imports only ``tidemesh.core`` from the project: never ``daemon``, ``broker`` or ``cli``. The
audit reads the broker's tables by their agreed names, not through the broker's code, so it can
run on a Spark cluster that has neither.
"""
