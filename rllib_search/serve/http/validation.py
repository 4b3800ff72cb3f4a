"""How the HTTP services read a request body, and what they answer for a malformed one: a 4xx with a message
that is always printable, never a 5xx.

A body is read by the endpoint itself, in this order, each step refusing with a 4xx before the next runs:

1. size: a ``Content-Length`` above the deployment's ``max_body_bytes`` is refused with 413 before a byte
   of the body is read; a body without one (chunked) is read until it passes the limit, then refused with
   413 (:func:`read_body`);
2. media type: a body whose content type is not JSON is refused with 415 (none at all is read as JSON,
   as FastAPI does);
3. JSON: a body that is not a JSON object is refused (:func:`parse_json_object`; this includes nesting too
   deep for Python's parser and integers too long for its conversion);
4. list lengths: each list field whose length has a bound is checked before the schema is (pydantic lists
   every bad item of a list, and FastAPI copies that list twice: a body of a million numbers where strings
   belong took minutes to answer);
5. schema: the pydantic model (:func:`validate`), whose complaints are reported without the input;
6. the endpoint's own bounds (characters, tokens, ranges).

A body may hold any JSON, including strings with lone surrogates (``"\\ud800"``), which Python decodes but
neither UTF-8 nor a tokenizer accepts. Such strings are refused with a 4xx before they reach a tokenizer
(:func:`invalid_unicode`), and no message echoes the raw input (FastAPI's default validation answer does,
and then fails to encode it: a 500).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from email.message import Message
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

# The longest form of one character in a JSON string is ``\uXXXX`` (6 bytes): what Python's ``json.dumps``
# (and so ``requests.post(json=...)``) writes for every character outside ASCII. A character outside the
# Basic Multilingual Plane takes two such escapes (12 bytes), so a request made only of those can reach
# the character bounds only with a larger ``max_body_bytes``.
JSON_BYTES_PER_CHAR = 6
# Room for the fields that carry no long strings, the punctuation and a client's whitespace.
BODY_SLACK_BYTES = 64 * 1024

ModelT = TypeVar("ModelT", bound=BaseModel)


class RequestRefused(Exception):
    """A request answered with ``status`` (a 4xx) and ``message`` instead of the endpoint's work."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = printable(message)
        self.status = status


class _HasErrors(Protocol):
    def errors(self) -> Any: ...


def printable(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry (lone surrogates) written as a backslash escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def default_body_bytes(strings: int, chars_per_string: int) -> int:
    """The body size limit that admits every request within the other bounds: ``strings`` strings of
    ``chars_per_string`` characters, each character written as ``\\uXXXX``, each string with its quotes and
    comma, plus :data:`BODY_SLACK_BYTES`."""
    return strings * (chars_per_string * JSON_BYTES_PER_CHAR + 3) + BODY_SLACK_BYTES


def check_body_limit(limit: Any) -> int:
    """``limit`` if it is a positive integer, else ValueError (for a deployment's ``limits``)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"max_body_bytes must be a positive integer, got {limit!r}")
    return limit


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, or :class:`RequestRefused` (413) as soon as it is known to pass ``limit`` bytes:
    from ``Content-Length`` before reading anything, else after reading at most one message of the body
    beyond the limit (a chunked body is not read to its end)."""
    declared = request.headers.getlist("content-length")
    if declared:
        if len(set(declared)) != 1 or not declared[0].strip().isdigit():
            raise RequestRefused(
                f"malformed request: Content-Length {declared[0][:40]!r} is not a length", 400
            )
        size = int(declared[0])
        if size > limit:
            raise RequestRefused(
                f"the request body has {size} bytes, at most {limit} allowed (the deployment's "
                "limits.max_body_bytes)",
                413,
            )
    chunks: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise RequestRefused(
                    f"the request body passes {limit} bytes, the most allowed (the deployment's "
                    "limits.max_body_bytes)",
                    413,
                )
            chunks.append(chunk)
    except ClientDisconnect as error:  # nobody reads the answer; a 4xx keeps it out of the 5xx counts
        raise RequestRefused("the client went away before the request body ended", 400) from error
    return b"".join(chunks)


def is_json_media_type(content_type: str | None) -> bool:
    """Whether a body of ``content_type`` is read as JSON: none at all, ``application/json`` or
    ``application/*+json`` (FastAPI's rule)."""
    if not content_type:
        return True
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def parse_json_object(body: bytes, content_type: str | None, status: int) -> dict[str, Any]:
    """The JSON object ``body`` holds, or :class:`RequestRefused`: 415 for a content type that is not JSON,
    ``status`` for a body that is not a JSON object."""
    if not is_json_media_type(content_type):
        raise RequestRefused(
            f"the body must be JSON (content-type: application/json), not {content_type[:60]}", 415
        )
    try:
        value = json.loads(body)
    except RecursionError as error:
        raise RequestRefused("malformed request: the body's JSON is nested too deeply", status) from error
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
        raise RequestRefused(f"malformed request: the body is not valid JSON ({error})", status) from error
    if not isinstance(value, dict):
        raise RequestRefused(
            f"malformed request: the body must be a JSON object, got {_json_type(value)}", status
        )
    return value


def check_length(body: dict[str, Any], field: str, bound: int, message: str, status: int) -> None:
    """:class:`RequestRefused` (``status``, ``message``) when ``body[field]`` is a list longer than ``bound``;
    ``message`` may use ``{bound}`` and ``{length}``."""
    value = body.get(field)
    if isinstance(value, list) and len(value) > bound:
        raise RequestRefused(message.format(bound=bound, length=len(value)), status)


def validate(model: type[ModelT], body: dict[str, Any], status: int) -> ModelT:
    """``body`` as ``model``, or :class:`RequestRefused` (``status``) with the validator's complaints."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise RequestRefused(validation_message(error), status) from error


def validation_message(error: _HasErrors, limit: int = 20) -> str:
    """The validator's complaints as one line (``loc: msg; ...``, at most ``limit``), without the input."""
    errors = error.errors()
    problems = [
        f"{'.'.join(str(part) for part in item.get('loc', ()))}: {item.get('msg', '')}"
        for item in errors[:limit]
    ]
    more = len(errors) - limit
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


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
