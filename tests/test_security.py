"""What a user's spec can make a server run, and where the fleet's credentials come from.

A server runs only kernels registered by the project's modules or by the modules its operator
names in ``TUNER_KERNEL_MODULES``; a spec names a kernel, never a module, a path or code. The
compose file keeps Ray's token authentication on and takes every credential from the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from sqlalchemy import select

from db import Sweep, SweepStatus, open_database, session_scope
from tests.cli_run import invoke_tuner
from tests.test_compose import (check_ray_token_auth, env_example_keys, environment, load_compose, services,
                                single_var_ref)
from tuner.sweep import queue
from tuner.sweep.serve import owner_name, run_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET_KEYS = ("PASSWORD", "TOKEN", "SECRET")


@pytest.mark.parametrize("spec,message", [
    ({"kernel": "os.system", "shapes": [{"n": 1}]}, "unknown kernel 'os.system'"),
    ({"kernel": "tests.fault_probe", "shapes": [{"n": 1}]}, "unknown kernel 'tests.fault_probe'"),
    ({"kernel": "kernels/rmsnorm.py:rms_norm", "shapes": [{"n": 1}]}, "unknown kernel"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "module": "evil"}, "module"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "code": "import os"}, "code"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "space": {"constraints": ["__import__('os')"]}},
     "'constraints' is not a parameter"),
])
def test_a_spec_names_a_registered_kernel_never_code(tmp_path, spec, message):
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, output = invoke_tuner(db, "sweep", "queue", str(path))
    assert code == 2 and message in output and "Traceback" not in output, output
    with session_scope(open_database(db)) as session:
        assert session.scalars(select(Sweep)).all() == []


def test_a_sweep_written_around_the_cli_imports_nothing(tmp_path, monkeypatch):
    """A row naming an importable module, stored straight into the database: the server fails the sweep
    as an unknown kernel and never imports the module (it would leave a file behind)."""
    marker = tmp_path / "imported"
    (tmp_path / "planted.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    engine = open_database(db)
    with session_scope(engine) as session:
        sweep = Sweep(kernel="planted", arch="auto", status="queued",
                      spec={"kernel": "planted", "shapes": [{"n": 1}]})
        session.add(sweep)
        session.flush()
        sweep_id = sweep.id
    owner = owner_name()
    assert queue.try_claim(engine, sweep_id, owner)
    with pytest.raises(Exception, match="unknown kernel 'planted'"):
        run_sweep(engine, db, sweep_id, owner, pool=None)  # fails before it needs a worker
    assert queue.get_sweep(engine, sweep_id).status == SweepStatus.failed.value
    assert not marker.exists()


def test_test_and_benchmark_kernels_are_not_registered_in_production():
    """Without TUNER_KERNEL_MODULES (a production server), the fault-injection and no-op kernels are unknown."""
    env = {k: v for k, v in os.environ.items() if k != "TUNER_KERNEL_MODULES"}
    out = subprocess.run([sys.executable, "-c", "from kernels import registry; print(registry.names())"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "rmsnorm_fwd" in out
    assert "fault_probe" not in out and "service_noop" not in out


def check_credentials_from_environment(compose: dict) -> None:
    """Every password, token or secret in a service's environment is one ``${VAR}`` reference, and a
    database URL's password is one too."""
    for name, svc in services(compose).items():
        for key, value in environment(svc).items():
            if any(word in key.upper() for word in SECRET_KEYS):
                assert single_var_ref(value), f"{name}: {key} is not taken from the environment: {value!r}"
            if isinstance(value, str) and "://" in value and "@" in value:
                userinfo = value.split("://", 1)[1].split("@", 1)[0]
                password = userinfo.split(":", 1)[1] if ":" in userinfo else ""
                assert single_var_ref(password), f"{name}: {key} holds a password that is not a variable"


def check_ray_token_auth_on(compose: dict) -> None:
    """Every Ray service has token authentication on, its token from the environment (``tests.test_compose``)."""
    check_ray_token_auth(compose, env_example_keys())


@pytest.mark.parametrize("check", [check_credentials_from_environment, check_ray_token_auth_on])
def test_compose_keeps_auth_on_and_secrets_in_the_environment(check):
    check(load_compose())


@pytest.mark.parametrize("check,service,key,value", [
    (check_credentials_from_environment, "postgres", "POSTGRES_PASSWORD", "hunter2"),
    (check_credentials_from_environment, "tuner-serve", "TUNER_DB_URL", "postgresql+psycopg://tuner:pw@postgres/tuner"),
    (check_ray_token_auth_on, "ray-head", "RAY_AUTH_MODE", "disabled"),
    (check_ray_token_auth_on, "ray-gpu-worker", "RAY_AUTH_TOKEN", "abc123"),
])
def test_the_checks_catch_a_broken_compose_file(check, service, key, value):
    compose = load_compose()
    services(compose)[service]["environment"] = {**environment(services(compose)[service]), key: value}
    with pytest.raises(AssertionError):
        check(compose)
