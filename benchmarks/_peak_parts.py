"""Where a process's peak RSS lies, read from inside it (Linux, glibc): what malloc has handed
out, what it holds free, the rest of the anonymous memory (Python's object arenas, thread
stacks, libraries' written data) and the pages of mapped files (libraries' code and read-only
data).

VmHWM says how high a process went, not what filled it. `probe_env` gives a child a
sitecustomize that starts `follow` in it: a thread reads the resident size every 5 ms and, at
each new high 1 MB above the last, takes the breakdown; the last one is written, as JSON, at
exit. malloc's counts cover all its arenas and its separately mapped blocks, so they do not
depend on its mmap threshold (ours is raised, nanoGPT's is glibc's).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
STEP_PAGES = 2**20 // PAGE  # a new breakdown at each 1 MB above the last
# glibc's struct mallinfo2, in order
FIELDS = ["arena", "ordblks", "smblks", "hblks", "hblkhd"]
FIELDS += ["usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"]
KINDS = ["rss", "malloc in use", "malloc free", "other anonymous", "files"]
HIGHEST: dict[str, dict[str, float | None]] = {}  # "parts": the breakdown at the last high
STATE = {"samples": 0, "error": ""}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]


_MALLINFO2 = getattr(ctypes.CDLL(None), "mallinfo2", None)  # glibc 2.33+; resolved once
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2


def _smaps_kb() -> tuple[int, int]:
    """(resident, of it anonymous) KB, summed over /proc/self/smaps."""
    rss = anonymous = 0
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if line.startswith("Rss:"):
                rss += int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anonymous += int(line.split()[1])
    return rss, anonymous


def breakdown() -> dict[str, float | None]:
    """This process's resident memory now, by kind, in MB; malloc's kinds None without
    mallinfo2 (another C library)."""
    rss, anonymous = (kb / 1024 for kb in _smaps_kb())
    parts: dict[str, float | None] = {"rss": rss, "files": rss - anonymous}
    if _MALLINFO2 is None:
        return {**parts, "malloc in use": None, "malloc free": None, "other anonymous": None}
    info = _MALLINFO2()
    in_use, free = (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20
    other = anonymous - in_use - free  # free chunks handed back with madvise lower it a little
    return {**parts, "malloc in use": in_use, "malloc free": free, "other anonymous": other}


def _resident_pages() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1])


def follow() -> None:
    """Follow this process's highs until it exits; a no-op without PEAK_PARTS_FILE."""
    target = os.environ.get("PEAK_PARTS_FILE")
    if not target:
        return
    HIGHEST["parts"], start = breakdown(), _resident_pages()

    def sample() -> None:
        best = start  # read here, not in the thread: growth before it first runs still counts
        try:
            while True:
                time.sleep(0.005)
                now = _resident_pages()
                if now >= best + STEP_PAGES:
                    HIGHEST["parts"], best = breakdown(), now
                    STATE["samples"] += 1
        except Exception as err:  # said in the record, never silently stale
            STATE["error"] = f"{type(err).__name__}: {err}"

    def write() -> None:
        Path(target).write_text(json.dumps({**HIGHEST["parts"], **STATE}))

    threading.Thread(target=sample, name="peak-parts", daemon=True).start()
    atexit.register(write)


SITECUSTOMIZE = """# written by benchmarks/_peak_parts.py: follow this process's peak, then run the
# sitecustomize this one shadows, if there is one
import importlib, sys
sys.path.append({bench!r})
import _peak_parts
sys.path.remove({bench!r})
_peak_parts.follow()
if {here!r} in sys.path:
    sys.path.remove({here!r})
del sys.modules["sitecustomize"]
try:
    importlib.import_module("sitecustomize")
except ModuleNotFoundError as missing:
    if missing.name != "sitecustomize":
        raise
"""


def probe_env(folder: Path, record: Path, pythonpath: str = "") -> dict[str, str]:
    """The variables that make a child write its peak breakdown to `record`: a sitecustomize
    in `folder`, put ahead of the child's `pythonpath`."""
    folder.mkdir(parents=True, exist_ok=True)
    bench = str(Path(__file__).resolve().parent)
    source = SITECUSTOMIZE.format(bench=bench, here=str(folder))
    (folder / "sitecustomize.py").write_text(source)
    path = os.pathsep.join(p for p in (str(folder), pythonpath) if p)
    return {"PYTHONPATH": path, "PEAK_PARTS_FILE": str(record)}
