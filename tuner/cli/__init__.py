"""The ``tuner`` command line: argument parsing and output; the work lives in the packages beside it."""
