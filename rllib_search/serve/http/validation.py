"""What the HTTP services answer for a malformed request: a message that is always printable.

A request body may hold any JSON, including strings with lone surrogates (``"\\ud800"``), which Python
decodes but neither UTF-8 nor a tokenizer accepts. Such strings are refused with a 4xx before they reach a
tokenizer, and an error message never echoes the raw input (FastAPI's default validation answer does, and
then fails to encode it: a 500).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi.exceptions import RequestValidationError


def printable(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry (lone surrogates) written as a backslash escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def validation_message(error: RequestValidationError, limit: int = 20) -> str:
    """The validator's complaints as one line (``loc: msg; ...``, at most ``limit``), without the input."""
    problems = [
        f"{'.'.join(str(part) for part in item.get('loc', ()))}: {item.get('msg', '')}"
        for item in error.errors()[:limit]
    ]
    more = len(error.errors()) - limit
    return printable(
        "malformed request: " + "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")
    )


def invalid_unicode(texts: Iterable[Any], name: str) -> str | None:
    """The reason the first string of ``texts`` that UTF-8 cannot encode is refused, or None."""
    for i, text in enumerate(texts):
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                return f"{name}[{i}] is not valid Unicode: {err.reason} at character {err.start}"
    return None
