"""An example as text with its training targets marked, for `stackwise data preview`."""

from __future__ import annotations

from typing import Any

IGNORE = -100


def marked(tokenizer: Any, ids: list[int], labels: list[int]) -> str:
    """The row's text with each run of target tokens inside [[ ]]."""
    out, run, on = [], [], False
    for tid, lab in zip(ids, labels, strict=True):
        target = lab != IGNORE
        if target != on and run:
            text = tokenizer.decode(run)
            out.append(f"[[{text}]]" if on else text)
            run = []
        on = target
        run.append(tid)
    if run:
        text = tokenizer.decode(run)
        out.append(f"[[{text}]]" if on else text)
    return "".join(out)
