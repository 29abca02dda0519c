"""Where a process's peak RSS lies, read from inside it (Linux): the heap that malloc grows,
how much of what malloc holds is in use, the other anonymous memory (Python's object arenas,
large blocks, thread stacks) and the pages of shared libraries and mapped files.

VmHWM says how high a process went, not what filled it. peak_memory.py starts this in a child
through a sitecustomize on its PYTHONPATH: a thread reads the resident size every 5 ms and, at
each new high 1 MB above the last, takes the breakdown; the last one is written, as JSON, at
exit to the file in PEAK_PARTS_FILE. The thread costs the process well under 1 MB.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import json
import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
STEP_PAGES = 2**20 // PAGE  # a new breakdown at each 1 MB above the last
# glibc's struct mallinfo2, in order
FIELDS = ["arena", "ordblks", "smblks", "hblks", "hblkhd"]
FIELDS += ["usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"]
HIGHEST: dict[str, dict[str, float | None]] = {}  # "parts": the breakdown at the last high


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]


def _malloc_in_use() -> float | None:
    """MB malloc has handed out and not had back (glibc 2.33+), or None elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        info = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    info.restype = _MallInfo2
    got = info()
    return (got.uordblks + got.hblkhd) / 2**20


def breakdown() -> dict[str, float | None]:
    """The resident memory of this process now, by kind, in MB (from /proc/self/smaps)."""
    rss = anonymous = heap = 0
    mapping = ""
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            key, _, rest = line.partition(" ")
            if not key.endswith(":"):  # a mapping's header: its address range, ..., its name
                parts = rest.split()
                mapping = parts[4] if len(parts) > 4 else ""
            elif key == "Rss:":
                kb = int(rest.split()[0])
                rss += kb
                heap += kb if mapping == "[heap]" else 0
            elif key == "Anonymous:":
                anonymous += int(rest.split()[0])
    return {
        "rss": rss / 1024,
        "heap": heap / 1024,
        "malloc in use": _malloc_in_use(),
        "other anonymous": (anonymous - heap) / 1024,
        "files": (rss - anonymous) / 1024,
    }


def _resident_pages() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1])


def start() -> None:
    """Follow this process's highs until it exits; a no-op without PEAK_PARTS_FILE."""
    target = os.environ.get("PEAK_PARTS_FILE")
    if not target:
        return
    HIGHEST["parts"] = breakdown()

    def follow() -> None:
        best = _resident_pages()
        while True:
            time.sleep(0.005)
            now = _resident_pages()
            if now >= best + STEP_PAGES:
                HIGHEST["parts"], best = breakdown(), now

    def write() -> None:
        with open(target, "w") as out:
            json.dump(HIGHEST["parts"], out)

    threading.Thread(target=follow, name="peak-parts", daemon=True).start()
    atexit.register(write)
