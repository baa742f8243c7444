"""How every ``tuner`` command reports an expected failure: one line on stderr, exit code 2, no traceback.

Bad specs and arguments, missing rows and plans that cannot fit are the user's to fix, so they get
the cause in words; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import typer

from tuner.cli.display import err_console


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and end the command with exit code 2."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@contextlib.contextmanager
def exit_2_on(errors: tuple[type[BaseException], ...]) -> Iterator[None]:
    """Inside the block, any of ``errors`` ends the command through :func:`fail`."""
    try:
        yield
    except errors as exc:
        fail(str(exc))


def reporting(errors: tuple[type[BaseException], ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator form of :func:`exit_2_on` for a typer command."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with exit_2_on(errors):
                return command(*args, **kwargs)

        return wrapper

    return decorate
