"""Whether a data file is UTF-8 text: a wide (UTF-16/32) file or an undecodable byte is refused
with the place and the command that converts it."""

from __future__ import annotations

import codecs
from pathlib import Path

from stackwise.errors import StackWiseError

# byte-order marks of the encodings editors (Windows' Notepad, Excel exports) save as "Unicode";
# UTF-32 first, as its little-endian mark starts with UTF-16's
BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _wide_encoding(path: Path) -> str | None:
    """UTF-16 or UTF-32 when the file starts with its byte-order mark (or, with no mark, when
    every other byte of its start is NUL, as ASCII text in UTF-16 is)."""
    with path.open("rb") as fh:
        head = fh.read(4096)
    for bom, name in BOMS:
        if head.startswith(bom):
            return name
    pairs = len(head) // 2
    if pairs >= 8 and min(head[0::2].count(0), head[1::2].count(0)) == 0 and head.count(0) >= pairs:
        return "UTF-16"
    return None


def check_utf8(path: Path) -> None:
    """Decode incrementally so a large file is checked without loading it whole."""
    wide = _wide_encoding(path)
    if wide is not None:
        raise StackWiseError(
            f"Data file '{path}' is {wide} text, not UTF-8. Convert it, e.g. `iconv -f {wide} "
            f"-t UTF-8 '{path.name}' > utf8-{path.name}`, and point the config at the new file."
        )
    dec = codecs.getincrementaldecoder("utf-8")()
    line, offset = 1, 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            try:
                dec.decode(chunk)
            except UnicodeDecodeError as err:
                bad = offset + err.start
                line += chunk[: err.start].count(b"\n")
                raise StackWiseError(
                    f"Data file '{path}' is not UTF-8 text: undecodable byte at offset {bad} "
                    f"(line {line}). Convert it, e.g. `iconv -f latin1 -t utf-8`, and rerun."
                ) from None
            line += chunk.count(b"\n")
            offset += len(chunk)
        try:
            dec.decode(b"", final=True)
        except UnicodeDecodeError:
            raise StackWiseError(
                f"Data file '{path}' ends in the middle of a UTF-8 character; it looks truncated."
            ) from None
