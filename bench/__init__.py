"""The benchmark suite: one module per claim the README makes, each run the same way on every machine.

A benchmark is a module ``bench/<name>.py`` whose docstring's first line states the claim it
measures, with ``add_arguments(parser)`` (its CLI arguments) and ``run(args) -> dict`` (JSON-able
figures, nested dicts allowed; a ``ValueError`` is bad input: the runner prints it and exits 2).
A benchmark that checks targets returns them as ``figures["targets"]``, rows of ``{"target", "measured",
"status"}``: the README's "where it stands" table is those rows. ``python -m bench <name> [args]``
runs one and writes its record (``bench/record.py``; a record converted from an older run may add a
``note`` saying how, and its ``raw`` measurements). A long benchmark calls ``args.save_partial(figures)``
as parts finish: ``<record>.partial`` keeps them until the complete record replaces it;
``python -m bench.report`` regenerates ``docs/performance.md`` and the README's table from the records.
"""
