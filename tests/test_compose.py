"""Consistency checks for docker-compose.yml, .env.example and docker/Dockerfile.

No Docker engine is needed: the compose file is parsed with PyYAML (anchors and ``<<``
merge keys resolved) and checked as data. Every check is a plain function that raises
AssertionError; ``test_check_catches`` breaks the parsed file in one way per check and
asserts that the check notices, so none of them can pass vacuously.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "docker" / "Dockerfile"

DB_SERVICE = "postgres"
HEAD_SERVICE = "ray-head"
GPU_WORKER = "ray-gpu-worker"
SERVE_SERVICE = "tuner-serve"
PROJECT_IMAGE_SERVICES = (HEAD_SERVICE, GPU_WORKER, SERVE_SERVICE)
MIN_RAY_FOR_TOKEN_AUTH = (2, 52)
RAY_DEFAULT_PORT = 6379
POSTGRES_DEFAULT_PORT = 5432

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, ${VAR:+alt}, $VAR
_VAR_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(?::?[-?+])[^}]*)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_SINGLE_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(?::?[-?+])[^}]*)?\}$|^\$([A-Za-z_][A-Za-z0-9_]*)$")
_DB_URL = re.compile(
    r"^(?P<scheme>[A-Za-z0-9+]+)://(?P<user>[^:@/]+):(?P<password>[^@/]+)@"
    r"(?P<host>[^:/]+)(?::(?P<port>\d+))?/(?P<db>[^?/]+)$"
)


# ----------------------------------------------------------------------------- helpers


def load_compose() -> dict:
    with COMPOSE_FILE.open() as f:
        return yaml.safe_load(f)


def env_example_keys(path: Path = ENV_EXAMPLE) -> set[str]:
    keys = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, _ = line.partition("=")
        assert sep, f"{path.name}: not a KEY=VALUE line: {line!r}"
        keys.add(key.removeprefix("export ").strip())
    return keys


def var_refs(text: str) -> set[str]:
    """Names interpolated by compose in ``text``; ``$$`` is a literal dollar, not a reference."""
    text = text.replace("$$", "")
    return {a or b for a, b in _VAR_REF.findall(text)}


def single_var_ref(value: Any) -> str | None:
    """``VAR`` when ``value`` is exactly one reference such as ``${VAR}`` or ``${VAR:?msg}``."""
    if not isinstance(value, str):
        return None
    m = _SINGLE_REF.match(value.strip())
    return (m.group(1) or m.group(2)) if m else None


def all_strings(node: Any):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from all_strings(k)
            yield from all_strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from all_strings(v)


def services(compose: dict) -> dict:
    return compose.get("services") or {}


def environment(svc: dict) -> dict[str, Any]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        out = {}
        for item in env:
            key, sep, value = str(item).partition("=")
            out[key] = value if sep else None
        return out
    return {str(k): v for k, v in env.items()}


def argv(svc: dict) -> list[str]:
    """The command as tokens; a ``sh -c``/``bash -c`` script is split into its tokens too."""
    cmd = svc.get("command")
    if cmd is None:
        return []
    tokens = shlex.split(cmd) if isinstance(cmd, str) else [str(t) for t in cmd]
    if len(tokens) >= 3 and Path(tokens[0]).name in ("sh", "bash") and tokens[1] == "-c":
        return shlex.split(tokens[2])
    return tokens


def invocations(tokens: list[str]) -> list[list[str]]:
    """Split a token list into the separate commands of a ``a && b; c`` script."""
    out, cur = [], []
    for tok in tokens:
        if tok in ("&&", "||", ";", "|"):
            out.append(cur)
            cur = []
        else:
            cur.append(tok)
    out.append(cur)
    return [c for c in out if c]


def subcommand(tokens: list[str], program: str, sub: str) -> list[str] | None:
    """The tokens of the ``program sub ...`` invocation (e.g. ``ray start``), or None."""
    for inv in invocations(tokens):
        for i in range(len(inv) - 1):
            if Path(inv[i]).name == program and inv[i + 1] == sub:
                return inv[i:]
    return None


def flag_values(tokens: list[str], flag: str) -> list[str]:
    values = []
    for i, tok in enumerate(tokens):
        if tok.startswith(flag + "="):
            values.append(tok.split("=", 1)[1])
        elif tok == flag and i + 1 < len(tokens):
            values.append(tokens[i + 1])
    return values


def ray_start(svc: dict) -> list[str] | None:
    return subcommand(argv(svc), "ray", "start")


def tuner_serve(svc: dict) -> list[str] | None:
    return subcommand(argv(svc), "tuner", "serve")


def ray_services(compose: dict) -> dict[str, dict]:
    """Services that start a Ray node or connect to Ray as a driver."""
    return {
        name: svc
        for name, svc in services(compose).items()
        if ray_start(svc) is not None or tuner_serve(svc) is not None
    }


def depends_on(svc: dict) -> dict[str, str]:
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def head_port(compose: dict) -> int:
    start = ray_start(services(compose)[HEAD_SERVICE])
    assert start is not None and "--head" in start, f"{HEAD_SERVICE} does not run `ray start --head`"
    ports = flag_values(start, "--port")
    return int(ports[-1]) if ports else RAY_DEFAULT_PORT


def volume_mounts(svc: dict) -> list[tuple[str | None, str, str]]:
    """(source, target, type) for each entry of a service's ``volumes``."""
    mounts = []
    for v in svc.get("volumes") or []:
        if isinstance(v, dict):
            mounts.append((v.get("source"), v["target"], v.get("type", "volume")))
            continue
        parts = str(v).split(":")
        if len(parts) == 1:  # anonymous volume
            mounts.append((None, parts[0], "volume"))
            continue
        source, target = parts[0], parts[1]
        kind = "bind" if source.startswith((".", "/", "~", "$")) else "volume"
        mounts.append((source, target, kind))
    return mounts


def gpu_device_requests(svc: dict) -> list[dict]:
    return (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []


# ------------------------------------------------------------------------------ checks


def check_no_version_key(compose: dict, env_keys: set[str]) -> None:
    assert "version" not in compose, "the Compose spec has no top-level `version:` key"
    for name in (DB_SERVICE, *PROJECT_IMAGE_SERVICES):
        assert name in services(compose), f"service {name!r} is missing"


def check_depends_on_targets_exist(compose: dict, env_keys: set[str]) -> None:
    svcs = services(compose)
    for name, svc in svcs.items():
        for target, condition in depends_on(svc).items():
            assert target in svcs, f"{name} depends on undefined service {target!r}"
            assert condition in ("service_started", "service_healthy", "service_completed_successfully"), (
                f"{name}: unknown depends_on condition {condition!r}"
            )


def check_healthy_targets_have_healthchecks(compose: dict, env_keys: set[str]) -> None:
    svcs = services(compose)
    for name, svc in svcs.items():
        for target, condition in depends_on(svc).items():
            if condition != "service_healthy":
                continue
            hc = svcs.get(target, {}).get("healthcheck") or {}
            assert hc.get("test") and not hc.get("disable"), (
                f"{name} waits for {target} to be healthy, but {target} has no healthcheck"
            )


def check_postgres_healthcheck(compose: dict, env_keys: set[str]) -> None:
    svcs = services(compose)
    pg = svcs[DB_SERVICE]
    test = (pg.get("healthcheck") or {}).get("test")
    assert test, f"{DB_SERVICE} has no healthcheck"
    tokens = shlex.split(test) if isinstance(test, str) else list(test)
    if tokens and tokens[0] in ("CMD", "CMD-SHELL"):
        tokens = shlex.split(tokens[1]) if tokens[0] == "CMD-SHELL" else tokens[1:]
    assert tokens and Path(tokens[0]).name == "pg_isready", f"{DB_SERVICE} healthcheck does not run pg_isready"
    env = environment(pg)
    for flag, key in (("-U", "POSTGRES_USER"), ("-d", "POSTGRES_DB")):
        for value in flag_values(tokens, flag):
            assert var_refs(value) == {postgres_var(pg, key)} or var_refs(value.replace("$$", "$")) == {key}, (
                f"pg_isready {flag} {value!r} does not use the variable behind {key} ({env.get(key)!r})"
            )
    assert depends_on(svcs[SERVE_SERVICE]).get(DB_SERVICE) == "service_healthy", (
        f"{SERVE_SERVICE} must wait for {DB_SERVICE} with condition service_healthy"
    )


def postgres_var(pg: dict, key: str) -> str:
    """The compose variable that sets ``key`` (POSTGRES_USER, ...) in the postgres container."""
    env = environment(pg)
    if key in env:
        ref = single_var_ref(env[key])
        assert ref, f"{DB_SERVICE}: {key} must come from the env file, got {env[key]!r}"
        return ref
    env_files = pg.get("env_file") or []
    env_files = [env_files] if isinstance(env_files, (str, dict)) else env_files
    paths = [f["path"] if isinstance(f, dict) else f for f in env_files]
    assert ".env" in paths, f"{DB_SERVICE} does not define {key}"
    return key  # taken verbatim from .env


def check_db_url(compose: dict, env_keys: set[str]) -> None:
    svcs = services(compose)
    url = environment(svcs[SERVE_SERVICE]).get("TUNER_DB_URL")
    assert url, f"{SERVE_SERVICE} has no TUNER_DB_URL"
    m = _DB_URL.match(url)
    assert m, f"TUNER_DB_URL is not user:password@host[:port]/db: {url!r}"
    assert m["scheme"].split("+")[0] == "postgresql", f"a fleet needs PostgreSQL, TUNER_DB_URL is {m['scheme']}"
    assert m["host"] == DB_SERVICE, f"TUNER_DB_URL host {m['host']!r} is not the {DB_SERVICE!r} service"
    pg = svcs[DB_SERVICE]
    assert str(pg.get("image", "")).startswith("postgres"), f"{DB_SERVICE} does not run a postgres image"
    pg_port = int(environment(pg).get("PGPORT") or POSTGRES_DEFAULT_PORT)
    assert int(m["port"] or POSTGRES_DEFAULT_PORT) == pg_port, f"TUNER_DB_URL port is not {pg_port}"
    for part, key in (("user", "POSTGRES_USER"), ("password", "POSTGRES_PASSWORD"), ("db", "POSTGRES_DB")):
        expected = postgres_var(pg, key)
        assert single_var_ref(m[part]) == expected, (
            f"TUNER_DB_URL {part} is {m[part]!r}, but {DB_SERVICE} takes {key} from ${{{expected}}}"
        )


def check_env_vars_declared(compose: dict, env_keys: set[str]) -> None:
    used = set().union(*(var_refs(s) for s in all_strings(compose)))
    missing = sorted(used - env_keys)
    assert not missing, f"docker-compose.yml uses variables missing from .env.example: {missing}"


def check_ray_addresses(compose: dict, env_keys: set[str]) -> None:
    expected = f"{HEAD_SERVICE}:{head_port(compose)}"
    head_ports = [str(p).split(":")[-1] for p in services(compose)[HEAD_SERVICE].get("ports") or []]
    for name, svc in ray_services(compose).items():
        if name == HEAD_SERVICE:
            continue
        addresses = []
        start = ray_start(svc)
        if start is not None:
            found = flag_values(start, "--address")
            assert found, f"{name}: `ray start` without --address"
            addresses += found
        serve = tuner_serve(svc)
        if serve is not None:
            found = flag_values(serve, "--ray-address")
            assert found or "RAY_ADDRESS" in environment(svc), f"{name}: `tuner serve` has no Ray address"
            addresses += found
        if "RAY_ADDRESS" in environment(svc):
            addresses.append(str(environment(svc)["RAY_ADDRESS"]))
        for addr in addresses:
            assert addr == expected, f"{name} points Ray at {addr!r}, the head listens on {expected!r}"
        if HEAD_SERVICE not in depends_on(svc):
            raise AssertionError(f"{name} does not depend on {HEAD_SERVICE}")
    for w in (GPU_WORKER, SERVE_SERVICE):
        assert w in ray_services(compose), f"{w} neither starts a Ray node nor runs tuner serve"
    if head_ports:
        assert str(head_port(compose)) in head_ports, "ray-head publishes a GCS port it does not listen on"


def check_ray_token_auth(compose: dict, env_keys: set[str]) -> None:
    token_vars = {}
    for name, svc in ray_services(compose).items():
        env = environment(svc)
        assert env.get("RAY_AUTH_MODE") == "token", f"{name}: RAY_AUTH_MODE is {env.get('RAY_AUTH_MODE')!r}"
        ref = single_var_ref(env.get("RAY_AUTH_TOKEN"))
        assert ref, f"{name}: RAY_AUTH_TOKEN must be a variable from .env, got {env.get('RAY_AUTH_TOKEN')!r}"
        token_vars[name] = ref
    assert set(PROJECT_IMAGE_SERVICES) <= set(token_vars), "a Ray service is missing token auth"
    assert len(set(token_vars.values())) == 1, f"Ray services use different token variables: {token_vars}"
    assert set(token_vars.values()) <= env_keys, "the Ray token variable is missing from .env.example"


def check_gpu_worker_reserves_gpus(compose: dict, env_keys: set[str]) -> None:
    svc = services(compose)[GPU_WORKER]
    requests = [
        d for d in gpu_device_requests(svc) if d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or [])
    ]
    assert requests, f"{GPU_WORKER} reserves no nvidia GPUs"
    for d in requests:
        count = d.get("count")
        assert count == "all" or d.get("device_ids") or (isinstance(count, int) and count > 0), (
            f"{GPU_WORKER}: GPU reservation needs count: all, a positive count or device_ids, got {d}"
        )
        if count == "all":
            replicas = (svc.get("deploy") or {}).get("replicas", 1)
            assert replicas <= 1, "with count: all every replica gets every GPU; Ray would count each GPU twice"
    start = ray_start(svc) or []
    assert "0" not in flag_values(start, "--num-gpus"), f"{GPU_WORKER} hides its GPUs from Ray (--num-gpus=0)"


def check_gpu_worker_scalable(compose: dict, env_keys: set[str]) -> None:
    svc = services(compose)[GPU_WORKER]
    assert "container_name" not in svc, f"{GPU_WORKER} has container_name, so it cannot be scaled"
    for p in svc.get("ports") or []:
        published = p.get("published") if isinstance(p, dict) else (str(p).split(":")[-2] if ":" in str(p) else None)
        assert not published, f"{GPU_WORKER} publishes host port {published}, so a second replica would clash"


def check_named_volumes_declared(compose: dict, env_keys: set[str]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, svc in services(compose).items():
        for source, target, kind in volume_mounts(svc):
            if kind == "volume" and source:
                assert source in declared, f"{name} mounts volume {source!r} that is not declared under volumes:"


def check_triton_cache_volume(compose: dict, env_keys: set[str]) -> None:
    svc = services(compose)[GPU_WORKER]
    cache_dir = environment(svc).get("TRITON_CACHE_DIR") or dockerfile_env("TRITON_CACHE_DIR")
    assert cache_dir, f"{GPU_WORKER}: TRITON_CACHE_DIR is not set"
    mounts = {target.rstrip("/"): (source, kind) for source, target, kind in volume_mounts(svc)}
    source, kind = mounts.get(str(cache_dir).rstrip("/"), (None, None))
    assert kind == "volume" and source, f"{GPU_WORKER}: TRITON_CACHE_DIR {cache_dir} is not on a named volume"


def check_project_image(compose: dict, env_keys: set[str]) -> None:
    svcs = services(compose)
    images = {name: svcs[name].get("image") for name in PROJECT_IMAGE_SERVICES}
    assert len(set(images.values())) == 1 and None not in images.values(), f"project services differ: {images}"
    for name in PROJECT_IMAGE_SERVICES:
        build = svcs[name].get("build")
        assert isinstance(build, dict), f"{name} has no build section"
        context = ROOT / build.get("context", ".")
        assert context.resolve() == ROOT, f"{name}: build context is not the repository root"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.resolve() == DOCKERFILE.resolve() and dockerfile.is_file(), (
            f"{name}: builds from {dockerfile}, expected {DOCKERFILE}"
        )


def dockerfile_env(key: str) -> str | None:
    m = re.search(rf"\b{key}=(\S+)", DOCKERFILE.read_text())
    return m.group(1) if m else None


def check_dockerfile_ray_version(compose: dict, env_keys: set[str], text: str | None = None) -> None:
    text = DOCKERFILE.read_text() if text is None else text
    m = re.search(r"^ARG\s+RAY_VERSION=(\d+)\.(\d+)", text, re.M)
    assert m, "docker/Dockerfile does not pin RAY_VERSION"
    assert (int(m[1]), int(m[2])) >= MIN_RAY_FOR_TOKEN_AUTH, "token authentication needs Ray >= 2.52"
    assert re.search(r"pip install\b[^\n]*\$\{RAY_VERSION\}", text), "RAY_VERSION is not what pip installs"
    assert re.search(r"pip install\s+(/src|\.)(\s|$)", text), "docker/Dockerfile does not pip install the project"


CHECKS: list[Callable[[dict, set[str]], None]] = [
    check_no_version_key,
    check_depends_on_targets_exist,
    check_healthy_targets_have_healthchecks,
    check_postgres_healthcheck,
    check_db_url,
    check_env_vars_declared,
    check_ray_addresses,
    check_ray_token_auth,
    check_gpu_worker_reserves_gpus,
    check_gpu_worker_scalable,
    check_named_volumes_declared,
    check_triton_cache_volume,
    check_project_image,
    check_dockerfile_ray_version,
]


# ------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


@pytest.fixture(scope="module")
def env_keys() -> set[str]:
    return env_example_keys()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_compose_is_consistent(check, compose, env_keys):
    check(compose, env_keys)


def test_env_example_has_required_keys(env_keys):
    assert {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "RAY_AUTH_TOKEN"} <= env_keys


def _svc(c: dict, name: str) -> dict:
    return c["services"][name]


def _set_env(name: str, key: str, value: Any) -> Callable[[dict], None]:
    def mutate(c: dict) -> None:
        svc = _svc(c, name)
        env = environment(svc)
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
        svc["environment"] = env

    return mutate


def _set_command(name: str, command: Any) -> Callable[[dict], None]:
    return lambda c: _svc(c, name).__setitem__("command", command)


def _pop(name: str, *path: str) -> Callable[[dict], None]:
    def mutate(c: dict) -> None:
        node = _svc(c, name)
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1])

    return mutate


def _set_depends(name: str, deps: Any) -> Callable[[dict], None]:
    return lambda c: _svc(c, name).__setitem__("depends_on", deps)


def _gpu_request(c: dict) -> dict:
    return gpu_device_requests(_svc(c, GPU_WORKER))[0]


_SERVE_SCRIPT = "ray start --address={} --num-cpus=0 --num-gpus=0 && exec tuner serve --ray-address {}"

BREAKAGES = [
    ("version key", lambda c: c.__setitem__("version", "3.8"), check_no_version_key),
    ("missing dependency", _set_depends(GPU_WORKER, ["ray-headd"]), check_depends_on_targets_exist),
    ("healthy target without healthcheck", _pop(HEAD_SERVICE, "healthcheck"), check_healthy_targets_have_healthchecks),
    ("postgres without healthcheck", _pop(DB_SERVICE, "healthcheck"), check_postgres_healthcheck),
    (
        "serve only waits for postgres to start",
        _set_depends(SERVE_SERVICE, {DB_SERVICE: {"condition": "service_started"}, HEAD_SERVICE: {}}),
        check_postgres_healthcheck,
    ),
    (
        "pg_isready for another user",
        lambda c: _svc(c, DB_SERVICE)["healthcheck"].__setitem__(
            "test", ["CMD", "pg_isready", "-U", "${PGUSER}", "-d", "${POSTGRES_DB}"]
        ),
        check_postgres_healthcheck,
    ),
    (
        "DB URL on localhost",
        _set_env(SERVE_SERVICE, "TUNER_DB_URL", "postgresql+psycopg://${POSTGRES_USER}:${POSTGRES_PASSWORD}@localhost:5432/${POSTGRES_DB}"),
        check_db_url,
    ),
    (
        "DB URL with another password variable",
        _set_env(SERVE_SERVICE, "TUNER_DB_URL", "postgresql+psycopg://${POSTGRES_USER}:${DB_PASSWORD}@postgres:5432/${POSTGRES_DB}"),
        check_db_url,
    ),
    (
        "DB URL on sqlite",
        _set_env(SERVE_SERVICE, "TUNER_DB_URL", "sqlite:///tuner.db"),
        check_db_url,
    ),
    (
        "DB URL wrong port",
        _set_env(SERVE_SERVICE, "TUNER_DB_URL", "postgresql+psycopg://${POSTGRES_USER}:${POSTGRES_PASSWORD}@postgres:5433/${POSTGRES_DB}"),
        check_db_url,
    ),
    ("undeclared variable", _set_env(HEAD_SERVICE, "RAY_LOG", "${RAY_LOG_LEVEL:-info}"), check_env_vars_declared),
    ("worker on wrong port", _set_command(GPU_WORKER, ["ray", "start", "--address=ray-head:6380", "--block"]), check_ray_addresses),
    (
        "head moved to another port",
        _set_command(HEAD_SERVICE, ["ray", "start", "--head", "--block", "--port=6380", "--num-gpus=0"]),
        check_ray_addresses,
    ),
    (
        "serve points at another host",
        _set_command(SERVE_SERVICE, ["bash", "-c", _SERVE_SCRIPT.format("ray-head:6379", "localhost:6379")]),
        check_ray_addresses,
    ),
    ("serve RAY_ADDRESS differs", _set_env(SERVE_SERVICE, "RAY_ADDRESS", "auto"), check_ray_addresses),
    ("worker without --address", _set_command(GPU_WORKER, ["ray", "start", "--block"]), check_ray_addresses),
    ("auth off on worker", _set_env(GPU_WORKER, "RAY_AUTH_MODE", "disabled"), check_ray_token_auth),
    ("serve without token", _set_env(SERVE_SERVICE, "RAY_AUTH_TOKEN", None), check_ray_token_auth),
    ("hard-coded token", _set_env(HEAD_SERVICE, "RAY_AUTH_TOKEN", "abc123"), check_ray_token_auth),
    ("different token variable", _set_env(GPU_WORKER, "RAY_AUTH_TOKEN", "${WORKER_TOKEN}"), check_ray_token_auth),
    ("no GPU reservation", _pop(GPU_WORKER, "deploy"), check_gpu_worker_reserves_gpus),
    ("AMD driver", lambda c: _gpu_request(c).__setitem__("driver", "amd"), check_gpu_worker_reserves_gpus),
    ("no gpu capability", lambda c: _gpu_request(c).__setitem__("capabilities", ["utility"]), check_gpu_worker_reserves_gpus),
    (
        "replicas double-count GPUs",
        lambda c: _svc(c, GPU_WORKER)["deploy"].__setitem__("replicas", 2),
        check_gpu_worker_reserves_gpus,
    ),
    (
        "worker hides GPUs",
        _set_command(GPU_WORKER, ["ray", "start", "--address=ray-head:6379", "--block", "--num-gpus=0"]),
        check_gpu_worker_reserves_gpus,
    ),
    ("container_name", lambda c: _svc(c, GPU_WORKER).__setitem__("container_name", "w"), check_gpu_worker_scalable),
    ("published worker port", lambda c: _svc(c, GPU_WORKER).__setitem__("ports", ["8000:8000"]), check_gpu_worker_scalable),
    ("undeclared volume", lambda c: c["volumes"].pop("pgdata"), check_named_volumes_declared),
    (
        "triton cache not on a volume",
        _set_env(GPU_WORKER, "TRITON_CACHE_DIR", "/root/.triton/cache"),
        check_triton_cache_volume,
    ),
    ("different image", lambda c: _svc(c, SERVE_SERVICE).__setitem__("image", "other:latest"), check_project_image),
    (
        "other Dockerfile",
        lambda c: _svc(c, HEAD_SERVICE).__setitem__("build", {"context": ".", "dockerfile": "Dockerfile"}),
        check_project_image,
    ),
]


@pytest.mark.parametrize("mutate,check", [(m, c) for _, m, c in BREAKAGES], ids=[b[0] for b in BREAKAGES])
def test_check_catches(mutate, check, compose, env_keys):
    broken = copy.deepcopy(compose)
    mutate(broken)
    with pytest.raises(AssertionError):
        check(broken, env_keys)


def test_check_catches_token_variable_missing_from_env_example(compose, env_keys):
    with pytest.raises(AssertionError):
        check_env_vars_declared(compose, env_keys - {"RAY_AUTH_TOKEN"})
    with pytest.raises(AssertionError):
        check_ray_token_auth(compose, env_keys - {"RAY_AUTH_TOKEN"})


@pytest.mark.parametrize(
    "text",
    [
        'ARG RAY_VERSION=2.51.0\nRUN python -m pip install /src "ray[default]==${RAY_VERSION}"\n',
        'ARG RAY_VERSION=2.60.0\nRUN python -m pip install /src "ray[default]>=2.0"\n',
        'ARG RAY_VERSION=2.60.0\nRUN python -m pip install "ray[default]==${RAY_VERSION}"\n',
    ],
    ids=["ray too old", "pin not used", "project not installed"],
)
def test_check_catches_dockerfile(text, compose, env_keys):
    with pytest.raises(AssertionError):
        check_dockerfile_ray_version(compose, env_keys, text)
