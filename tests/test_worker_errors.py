"""A failed trial's stored error keeps the cause that Triton chains under its CompilationError."""

from __future__ import annotations

from workers.errors import ERROR_TEXT_LIMIT, error_text


def _chained() -> BaseException:
    try:
        try:
            raise AttributeError("'tensor_descriptor_type' object has no attribute 'scalar'")
        except AttributeError as inner:
            raise RuntimeError("at 30:12: a = _load_a(...)") from inner
    except RuntimeError as outer:
        return outer


def test_error_text_names_the_location_and_the_cause():
    text = error_text(_chained())
    assert text.startswith("RuntimeError: at 30:12")
    assert text.endswith("caused by: AttributeError: 'tensor_descriptor_type' object has no attribute 'scalar'")


def test_error_text_keeps_the_end_of_a_long_chain():
    text = error_text(RuntimeError("x" * (2 * ERROR_TEXT_LIMIT)))
    assert len(text) == ERROR_TEXT_LIMIT and text.endswith("x")
