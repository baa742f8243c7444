"""Test set-up: the CPU interpreter when there is no GPU, the fault-probe kernel, empty user data and tables
folders, a fresh DB, a local Ray."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Before anything imports triton: kernels run on the CPU interpreter unless a GPU is present.
try:
    import torch

    _has_gpu = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _has_gpu = False
if not _has_gpu:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["TUNER_KERNEL_MODULES"] = "tests.fault_probe"
# Whatever the user's data folder holds (an exported table, a database) stays out of the tests: the user
# tables folder and the data dir (the default database) are empty folders of this run; a test that
# needs a table writes its own.
_USER_DATA = tempfile.mkdtemp(prefix="tuner-tests-")
atexit.register(shutil.rmtree, _USER_DATA, ignore_errors=True)
os.environ["XDG_DATA_HOME"] = _USER_DATA
os.environ["TUNER_TABLES_DIR"] = os.path.join(_USER_DATA, "tables")
os.environ.pop("TUNER_DB_URL", None)
os.environ["TUNER_SPACES_PATH"] = str(ROOT / "tests" / "spaces")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(ROOT))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--postgres-url", default=os.environ.get("TUNER_TEST_POSTGRES_URL"),
                     help="run the database tests against this PostgreSQL server too")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_url" in metafunc.fixturenames:
        urls = ["sqlite"]
        if metafunc.config.getoption("--postgres-url"):
            urls.append("postgresql")
        metafunc.parametrize("db_backend", urls)


@pytest.fixture
def db_url(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A URL to an empty database: a SQLite file, or a fresh schema-less PostgreSQL database."""
    if db_backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'tuner.db'}"
        return
    import uuid

    from sqlalchemy import create_engine, text

    base = request.config.getoption("--postgres-url")
    name = f"tuner_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # a test restarts the server
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield base.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs for the module: in-process commands join it instead of starting their own."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # not a Ray the machine runs
    yield
    ray.shutdown()


@pytest.fixture
def fresh_lookup():
    """``kernels.tuning``'s per-(kernel, shape) cache emptied before and after the test, so that an
    environment override or table set in it is read and does not outlive it."""
    from kernels import tuning  # after the set-up above: importing kernels imports triton

    tuning.clear_cache()
    yield
    tuning.clear_cache()
