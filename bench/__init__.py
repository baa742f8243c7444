"""The benchmark suite: one module per claim the README makes, each run the same way on every machine.

A benchmark is a module ``bench/<name>.py`` whose docstring's first line states the claim it
measures, with ``add_arguments(parser)`` (its CLI arguments) and ``run(args) -> dict`` (JSON-able
figures, nested dicts allowed; a ``ValueError`` is bad input: the runner prints it and exits 2).
``python -m bench <name> [args]`` runs one and writes its record (``bench/record.py``);
``python -m bench.report`` regenerates ``docs/performance.md`` and the README's table from the records.
"""
