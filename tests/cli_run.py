"""Running the ``tuner`` CLI in-process against a test database, shared by the CLI test files."""

from __future__ import annotations

from typer.testing import CliRunner

from tuner.cli.main import app


def invoke_tuner(db: str, *args: str) -> tuple[int, str]:
    """``tuner --db DB ARGS...``: its exit code and output; an exception other than an exit is raised."""
    result = CliRunner().invoke(app, ["--db", db, *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output
