"""How every ``tuner`` command reports an expected failure: one line on stderr, exit code 2, no traceback.

Bad specs and arguments, missing rows, unusable databases and plans that cannot fit are the user's
to fix, so they get the cause in words; anything else is a bug and keeps its traceback. A command names its error
classes as ``"module:Class"`` strings (or a function that imports them), so that the CLI's entry
imports no heavy module: a class whose module was never imported cannot have raised.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, Union

import typer

from tuner.cli.display import err_console

if TYPE_CHECKING:
    from sqlalchemy import Engine

ID_MAX = 2**63 - 1  # database ids are 64-bit: a larger one is refused as an argument, not sent to SQL
Errors = Union[tuple[Union[type[BaseException], str], ...], Callable[[], tuple[type[BaseException], ...]]]


def fail(message: str) -> NoReturn:
    """Print ``error: message`` (as it is: brackets in it are not markup) on stderr and end the command
    with exit code 2."""
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _classes(errors: Errors) -> tuple[type[BaseException], ...]:
    """The classes of ``errors``; a ``"module:Class"`` whose module is not loaded is left out."""
    if callable(errors):
        return errors()
    found = []
    for error in errors:
        if isinstance(error, str):
            module, _, name = error.partition(":")
            if module not in sys.modules:
                continue
            error = getattr(sys.modules[module], name)
        found.append(error)
    return tuple(found)


@contextlib.contextmanager
def exit_2_on(errors: Errors) -> Iterator[None]:
    """Inside the block, any of ``errors`` (or a ``db.DatabaseError``) ends the command through :func:`fail`."""
    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:
        if isinstance(exc, (*_classes(("db.engine:DatabaseError",)), *_classes(errors))):
            fail(str(exc))
        raise


def reporting(errors: Errors) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator form of :func:`exit_2_on` for a typer command."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with exit_2_on(errors):
                return command(*args, **kwargs)

        return wrapper

    return decorate


def open_engine(url: str) -> Engine:
    """The database at ``url`` with its schema upgraded; every way it can be unusable (a bad URL, a
    server that refuses, a file that is not SQLite, a schema revision this tuner does not know) is a
    :class:`db.DatabaseError` naming the database and the reason."""
    from alembic.util.exc import CommandError

    from db import DatabaseError, open_database

    try:
        return open_database(url)
    except OSError as exc:  # the schema lock beside a SQLite file in a folder that is not there
        raise DatabaseError(f"database {_shown(url)}: unable to open: {exc.strerror or exc}") from None
    except CommandError as exc:
        raise DatabaseError(f"database {_shown(url)}: {exc}; its schema was written by another version of "
                            "the tuner (upgrade the tuner, or use another --db)") from None


def command_engine(ctx: typer.Context) -> Engine:
    """The database of the running command: the root's ``--db`` (or ``TUNER_DB_URL``), else the default."""
    from db import default_url

    return open_engine(ctx.find_root().params.get("db") or default_url())


def _shown(url: str) -> str:
    """``url`` without its password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return repr(url)
