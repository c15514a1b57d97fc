"""A run that fails because Spark could not load a JDBC driver (a jar that is there but holds
no driver, one given to spark-submit) says which package to install, in one line."""

from __future__ import annotations

from tidemesh.spark.store import Dialect, driver_named, missing_driver


def test_a_class_not_found_names_the_dialect_and_its_package() -> None:
    causes = ['{"errorClass":"FAILED_JDBC.UNCLASSIFIED"}',
              "java.lang.ClassNotFoundException: org.sqlite.JDBC"]
    assert driver_named(causes) is Dialect.SQLITE
    assert driver_named(["java.lang.ClassNotFoundException: org.postgresql.Driver"]) is (
        Dialect.POSTGRES)
    assert driver_named(["java.sql.SQLException: path to 'x.db' does not exist"]) is None
    line = missing_driver(Dialect.POSTGRES, "/usr/share/java/postgresql.jar")
    assert "\n" not in line and "apt-get install libpostgresql-jdbc-java" in line
    assert "audit.pg_jar" in line
