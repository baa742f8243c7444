"""``python -m tuner.cli``: the same command as ``tuner``."""

from tuner.cli.main import app

app()
