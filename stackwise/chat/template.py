"""Chat templates: the tokenizer's own, one given in data.chat_template, or our default.

The default, used only when a tokenizer has none, is documented in the README:

    <|system|>\\n{content}{eos}\\n  <|user|>\\n{content}{eos}\\n  <|assistant|>\\n{content}{eos}\\n

It ends every turn with the tokenizer's EOS, so a model trained on it learns to stop with the
token generation already stops at, and it needs no new tokens in the vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError

DEFAULT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


PROBE = "Zq7"  # a reply no template writes by itself


def use_template(tokenizer: Any, given: str | None) -> str:
    """Set the template the run renders with (checked on a one-turn conversation); returns
    where it came from (for the header)."""
    source = _set_template(tokenizer, given)
    where = {
        "the tokenizer's chat template": f"of '{tokenizer.name_or_path}' (its "
        "tokenizer_config.json)",
        "data.chat_template": "given in data.chat_template",
    }.get(source, f"({source})")
    where = f"The chat template {where}"
    tokenizer._stackwise_template = where
    _check_template(tokenizer, where)
    return source


def _check_template(tokenizer: Any, where: str) -> None:
    """A template that is not valid Jinja, or that leaves the assistant's reply out, fails
    every example: named here, so the data is not blamed."""
    from jinja2 import TemplateSyntaxError

    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False)
    except TemplateSyntaxError as err:
        raise StackWiseError(_invalid_jinja(where, err)) from None
    except Exception:  # the template refuses this conversation: the data's check tells why
        return
    if PROBE not in text:
        raise StackWiseError(
            f"{where} never renders an assistant reply (the reply "
            f"'{PROBE}' of a test conversation is missing from its output), so no reply could "
            "be trained. Fix the template to write each assistant message's content, or set "
            "data.chat_template to one that does."
        )


def _invalid_jinja(where: str, err: Exception) -> str:
    return (
        f"{where} is not a valid Jinja template ({err}). Fix the "
        "template, or set data.chat_template to a working one."
    )


def _set_template(tokenizer: Any, given: str | None) -> str:
    if given:
        path = Path(given).expanduser()
        looks_like_file = "{" not in given and "\n" not in given
        if looks_like_file:
            if not path.is_file():
                raise StackWiseError(
                    f"data.chat_template '{given}' is not a template (no {{% or {{{{) and no "
                    "such file exists. Give the path of a Jinja template file, or the template "
                    "text itself."
                )
            tokenizer.chat_template = path.read_text(encoding="utf-8")
            return f"template file {path}"
        tokenizer.chat_template = given
        return "data.chat_template"
    if getattr(tokenizer, "chat_template", None):
        return "the tokenizer's chat template"
    if tokenizer.eos_token is None:
        raise StackWiseError(
            "This tokenizer has no chat template and no EOS token, so turns cannot be ended. "
            "Set data.chat_template to a Jinja template."
        )
    tokenizer.chat_template = DEFAULT_TEMPLATE
    return "StackWise's default chat template (the tokenizer has none)"


def render(tokenizer: Any, messages: list[dict], generation_prompt: bool = False) -> str:
    """The conversation as text; an empty one is whatever the template puts before any turn."""
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as err:  # jinja errors, including the template's own raise_exception
        from jinja2 import TemplateSyntaxError

        if not messages:
            return ""
        where = getattr(tokenizer, "_stackwise_template", "The chat template")
        if isinstance(err, TemplateSyntaxError):
            raise StackWiseError(_invalid_jinja(where, err)) from None
        raise StackWiseError(
            f"{where} failed on a conversation ({type(err).__name__}: "
            f"{str(err)[:160]}). Roles were {[m['role'] for m in messages]}; fix the data or "
            "set data.chat_template to a template that accepts them."
        ) from None


def has_generation_spans(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "{% generation %}" in template.replace("{%-", "{%")


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """Token ids that end an assistant turn under this template (EOS first), so that generation
    stops at either; found by rendering a one-turn reply and reading what follows its text."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    text = render(
        tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}]
    )
    after = text[text.rfind(PROBE) + len(PROBE) :]
    special = set(tokenizer.all_special_ids)
    for tid in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if tid in special:
            if tid not in ids:
                ids.append(tid)
            break
    return ids
