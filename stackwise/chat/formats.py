"""Chat and instruction rows in the shapes users bring, each turned into one list of messages.

Every format ends as `[{"role": ..., "content": ...}, ...]` with roles system, user, assistant or
tool, so templating and label masking are written once. A row that fits no format, an unknown
role or an empty conversation is an error naming the example, never a silent skip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stackwise.errors import StackWiseError

Message = dict[str, str]
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT speaker names, and the aliases other exports use, to our four roles
SPEAKERS = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "tool": "tool",
    "function": "tool",
    "function_response": "tool",
    "observation": "tool",
}
# format name -> the columns that mark it, checked in this order by auto-detection
MARKERS = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "prompt_response": ("prompt",),
    "alpaca": ("instruction", "output"),
}

# format name -> every column it reads (data.text_field may name these: they are its text)
READS = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "prompt_response": ("system", "prompt", "response", "completion"),
    "alpaca": ("system", "instruction", "input", "output"),
}


def detect_format(columns: list[str], text_fields: list[str]) -> str:
    """The format whose marker columns a dataset has; `text` when it has the text fields."""
    for name, needed in MARKERS.items():
        if all(c in columns for c in needed):
            return name
    if all(f in columns for f in text_fields):
        return "text"
    raise StackWiseError(
        f"Cannot tell the chat format of columns {columns}. Expected 'messages' (OpenAI), "
        "'conversations' (ShareGPT), 'prompt' with 'response' or 'completion', 'instruction' "
        "with 'output' (Alpaca), or data.text_field naming text columns; or set "
        "data.chat_format."
    )


def _fail(index: int | str, problem: str) -> StackWiseError:
    return StackWiseError(f"Example {index}: {problem}")


def _text(value: Any, index: int | str, what: str) -> str:
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):  # OpenAI parts
        kinds = {p.get("type") for p in value}
        if kinds <= {"text"}:
            return "".join(str(p.get("text", "")) for p in value)
        raise _fail(
            index, f"{what} has {sorted(map(str, kinds - {'text'}))} parts; only text is supported."
        )
    if not isinstance(value, str):
        raise _fail(index, f"{what} is {type(value).__name__}, not text.")
    return value


def _reply(value: Any, index: int | str, what: str) -> str:
    """A reply must be there: a missing one (None, as datasets fills absent columns) would
    train the model to answer with nothing."""
    if value is None:
        raise _fail(index, f"{what} is missing or null. Give every example its reply.")
    text = _text(value, index, what)
    if not text.strip():  # only the end of the turn would be trained: "answer with nothing"
        raise _fail(index, f"{what} is an empty reply. Give every example its reply.")
    return text


def _turns(turns: Any, index: int | str, role_key: str, content_key: str) -> list[Message]:
    if not isinstance(turns, list) or not turns:
        raise _fail(index, "the conversation is empty. Remove the example or give it turns.")
    out = []
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict) or role_key not in turn:
            raise _fail(index, f"turn {j} has no '{role_key}' key (got {turn!r:.80}).")
        raw = str(turn[role_key]).strip().lower()
        role = SPEAKERS.get(raw)
        if role is None:
            raise _fail(
                index,
                f"turn {j} has the unknown role {turn[role_key]!r}. Known roles: "
                f"{', '.join(sorted(SPEAKERS))}.",
            )
        read = _reply if role == "assistant" else _text
        out.append({"role": role, "content": read(turn.get(content_key), index, f"turn {j}")})
    return out


def _messages(row: dict, index: int | str, fields: list[str]) -> list[Message]:
    return _turns(row.get("messages"), index, "role", "content")


def _sharegpt(row: dict, index: int | str, fields: list[str]) -> list[Message]:
    return _turns(row.get("conversations"), index, "from", "value")


def _prompt_response(row: dict, index: int | str, fields: list[str]) -> list[Message]:
    answer_key = "response" if "response" in row else "completion"
    if answer_key not in row:
        raise _fail(index, "has 'prompt' but neither 'response' nor 'completion'.")
    out = []
    if row.get("system"):
        out.append({"role": "system", "content": _text(row["system"], index, "'system'")})
    out.append({"role": "user", "content": _text(row.get("prompt"), index, "'prompt'")})
    out.append({"role": "assistant", "content": _reply(row[answer_key], index, f"'{answer_key}'")})
    return out


def _alpaca(row: dict, index: int | str, fields: list[str]) -> list[Message]:
    instruction = _text(row.get("instruction"), index, "'instruction'")
    extra = _text(row.get("input"), index, "'input'")
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    out = []
    if row.get("system"):
        out.append({"role": "system", "content": _text(row["system"], index, "'system'")})
    out.append({"role": "user", "content": prompt})
    out.append({"role": "assistant", "content": _reply(row.get("output"), index, "'output'")})
    return out


def _plain(row: dict, index: int | str, fields: list[str]) -> list[Message]:
    """Text fields joined: one assistant message, so every token is a training target."""
    missing = [f for f in fields if f not in row]
    if missing:
        raise _fail(
            index,
            f"has no field {missing[0]!r} (its fields: {sorted(row)}). Set data.text_field to "
            "its text fields, or data.chat_format to the format of its rows.",
        )
    parts = [_text(row.get(f), index, f"'{f}'") for f in fields]
    return [{"role": "assistant", "content": "\n\n".join(p for p in parts if p)}]


CONVERTERS: dict[str, Callable[[dict, int, list[str]], list[Message]]] = {
    "messages": _messages,
    "sharegpt": _sharegpt,
    "prompt_response": _prompt_response,
    "alpaca": _alpaca,
    "text": _plain,
}


def to_messages(row: dict, fmt: str, index: int | str, text_fields: list[str]) -> list[Message]:
    """One row as messages; `index` (0-based) names it in errors."""
    needed = MARKERS.get(fmt, ())
    if any(row.get(c) is None for c in needed):
        present = [k for k, v in row.items() if v is not None]
        raise _fail(
            index,
            f"is not a '{fmt}' row (it has {sorted(present)}), though the data's format is "
            f"'{fmt}'. One file holds one format: split the file, or fix the row.",
        )
    messages = CONVERTERS[fmt](row, index, text_fields)
    if not any(m["content"].strip() for m in messages):
        raise _fail(index, "every message is empty. Remove the example or fill it in.")
    return messages
