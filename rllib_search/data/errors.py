"""The one error raised for a malformed data file: it points at the file, the row and the field."""

from __future__ import annotations

from pathlib import Path


class DataFormatError(ValueError):
    """A data file that does not follow its format.

    ``row`` is the 0-based row (parquet) or line (jsonl) index and ``field`` the dotted field name; either
    is None when the problem is not tied to one, e.g. a missing column has no row. The message reads
    ``train.jsonl: row 7, field 'golden_answers': expected a list of strings, got int``.
    """

    def __init__(self, path: str | Path, row: int | None, field: str | None, reason: str) -> None:
        self.path = Path(path)
        self.row = row
        self.field = field
        self.reason = reason
        where = ", ".join(
            part
            for part in (
                f"row {row}" if row is not None else "",
                f"field {field!r}" if field is not None else "",
            )
            if part
        )
        super().__init__(f"{path}: {where}: {reason}" if where else f"{path}: {reason}")

    def __reduce__(self) -> tuple[type[DataFormatError], tuple[Path, int | None, str | None, str]]:
        # Ray ships exceptions between processes by pickling; rebuild from the four parts, not the message.
        return type(self), (self.path, self.row, self.field, self.reason)
