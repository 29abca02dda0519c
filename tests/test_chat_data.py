"""Instruction data: formats, templates, target marks, packing and padding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stackwise.chat.data import IGNORE, ChatStats, best_fit_bins, examples_of, to_rows
from stackwise.chat.formats import detect_format, to_messages
from stackwise.chat.labels import tokenize_conversation
from stackwise.chat.template import DEFAULT_TEMPLATE, end_of_turn_ids, use_template
from stackwise.config import DataConfig
from stackwise.data.tokenizer import byte_tokenizer as plain_byte_tokenizer
from stackwise.errors import StackWiseError


def byte_tokenizer():
    """Chat data is rendered by transformers' class (as build_chat_data converts it)."""
    return plain_byte_tokenizer().to_transformers()


CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Ciao."},
]
UNMARKED = DEFAULT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


@pytest.fixture
def tok():
    t = byte_tokenizer()
    use_template(t, None)
    return t


def targets(tok, t) -> str:
    return tok.decode([i for i, s in zip(t.ids, t.supervised, strict=True) if s])


def test_formats_become_messages():
    rows = {
        "messages": {
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        },
        "sharegpt": {
            "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
        },
        "prompt_response": {"prompt": "q", "response": "a"},
        "alpaca": {"instruction": "q", "input": "", "output": "a"},
    }
    for fmt, row in rows.items():
        assert detect_format(sorted(row), ["text"]) == fmt
        msgs = to_messages(row, fmt, 0, ["text"])
        assert [m["role"] for m in msgs] == ["user", "assistant"], fmt
        assert msgs[-1]["content"] == "a"
    assert to_messages({"prompt": "q", "completion": "c"}, "prompt_response", 0, [])[-1] == {
        "role": "assistant",
        "content": "c",
    }
    alpaca = to_messages({"instruction": "Do", "input": "this", "output": "ok"}, "alpaca", 0, [])
    assert alpaca[0]["content"] == "Do\n\nthis"
    joined = to_messages({"a": "x", "b": "y"}, "text", 0, ["a", "b"])
    assert joined == [{"role": "assistant", "content": "x\n\ny"}]
    sys_tool = to_messages(
        {"conversations": [{"from": "system", "value": "s"}, {"from": "tool", "value": "t"}]},
        "sharegpt",
        0,
        [],
    )
    assert [m["role"] for m in sys_tool] == ["system", "tool"]


def test_bad_rows_name_the_example():
    with pytest.raises(StackWiseError, match="Example 7: turn 1 has the unknown role 'wizard'"):
        to_messages(
            {"messages": [{"role": "user", "content": "q"}, {"role": "wizard", "content": "a"}]},
            "messages",
            7,
            [],
        )
    with pytest.raises(StackWiseError, match="Example 3: the conversation is empty"):
        to_messages({"messages": []}, "messages", 3, [])
    with pytest.raises(StackWiseError, match="Cannot tell the chat format"):
        detect_format(["foo"], ["text"])


@pytest.mark.parametrize("template", [None, UNMARKED], ids=["generation-tags", "prefix"])
def test_assistant_targets_with_and_without_template_tags(template):
    tok = byte_tokenizer()
    use_template(tok, template)
    t = tokenize_conversation(tok, CONVO, 0, "assistant", "turn", 512)
    assert targets(tok, t).replace("\n", "") == "Hello!<eos>Ciao.<eos>"
    t = tokenize_conversation(tok, CONVO, 0, "assistant", "none", 512)
    assert targets(tok, t) == "Hello!Ciao."
    t = tokenize_conversation(tok, CONVO, 0, "last_turn", "turn", 512)
    assert targets(tok, t).strip() == "Ciao.<eos>"
    t = tokenize_conversation(tok, CONVO, 0, "assistant", "last", 512)
    assert targets(tok, t).strip() == "Hello!Ciao.<eos>"
    t = tokenize_conversation(tok, CONVO, 0, "all", "none", 512)
    assert "<eos>" not in targets(tok, t) and "Be brief." in targets(tok, t)


def test_chatml_template_finds_replies_by_prefix():
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    use_template(tok, CHATML)
    t = tokenize_conversation(tok, CONVO, 0, "assistant", "turn", 512)
    assert targets(tok, t).replace("\n", "") == "Hello!<|im_end|>Ciao.<|im_end|>"
    assert end_of_turn_ids(tok) == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]


def test_exactly_one_bos():
    """A tokenizer that puts BOS before text: a template writing BOS itself gets no second
    one, a template without gets the tokenizer's; one that adds none gets none added."""
    from tokenizers.processors import TemplateProcessing

    tok = byte_tokenizer()
    bos = tok.bos_token_id
    assert tok("a")["input_ids"][0] != bos
    use_template(tok, UNMARKED.replace("{{ bos_token }}", ""))
    assert bos not in tokenize_conversation(tok, CONVO, 0, "assistant", "turn", 512).ids
    tok = byte_tokenizer()
    tok._tokenizer.post_processor = TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", bos)]
    )
    assert tok("a")["input_ids"][0] == bos
    for template in (None, UNMARKED.replace("{{ bos_token }}", "")):
        tok.chat_template = None
        use_template(tok, template)
        t = tokenize_conversation(tok, CONVO, 0, "assistant", "turn", 512)
        assert t.ids.count(bos) == 1 and t.ids[0] == bos and not t.supervised[0]


def test_unsupervised_examples_fail_or_are_dropped_and_counted(tok):
    rows = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ok"}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
    ]
    cfg = DataConfig(mode="instruction", files=["x.jsonl"], seq_len=64)
    with pytest.raises(StackWiseError, match="Example 1 has no target token"):
        examples_of(rows, tok, cfg, ChatStats())
    stats = ChatStats()
    cfg = cfg.model_copy(update={"drop_unsupervised": True})
    kept = examples_of(rows, tok, cfg, stats)
    assert len(kept) == 1 and stats.dropped == 1 and "1 dropped" in stats.line()


def test_truncation_is_counted(tok):
    rows = [{"prompt": "p" * 50, "response": "r" * 50}, {"prompt": "p", "response": "r"}]
    stats = ChatStats()
    cfg = DataConfig(mode="instruction", files=["x.jsonl"], seq_len=80)
    examples_of(rows, tok, cfg, stats)
    assert stats.truncated == 1 and "1 cut at data.seq_len" in stats.line()


def test_padding_is_masked_by_position_even_when_pad_is_eos(tok):
    """With pad = eos, the trained end-of-turn eos stays a target; padding never is."""
    rows = [
        {"prompt": "a", "response": "long reply here"},
        {"prompt": "b", "response": "x"},
    ]
    cfg = DataConfig(mode="instruction", files=["x.jsonl"], seq_len=128)
    ex = examples_of(rows, tok, cfg, ChatStats())
    data = to_rows(ex, pad_id=tok.eos_token_id, packing=False, capacity=128)
    batch = data.collate([data[0], data[1]])
    short = len(ex[1][0])
    assert batch["attention_mask"][1, :short].all() and not batch["attention_mask"][1, short:].any()
    assert (batch["labels"][1, short:] == IGNORE).all()
    eos_targets = (batch["labels"][1] == tok.eos_token_id).sum()
    assert eos_targets == 1  # the reply's own end of turn, not the padding after it


def test_best_fit_bins_fill_tightly():
    lengths = [7, 5, 4, 3, 3, 2, 1]
    bins = best_fit_bins(lengths, 8)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 8 for b in bins)
    assert len(bins) == 4  # 25 tokens in bins of 8


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text("abc xyz", min_size=1, max_size=12), st.text("pqr", min_size=1, max_size=12)
        ),
        min_size=1,
        max_size=4,
    )
)
def test_targets_are_exactly_the_replies(turns):
    """Any conversation: the targets spell each reply followed by its end-of-turn token."""
    tok = byte_tokenizer()
    use_template(tok, None)
    messages = []
    for q, a in turns:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    t = tokenize_conversation(tok, messages, 0, "assistant", "turn", 4096)
    want = "".join(a.strip() + "<eos>" for _, a in turns)
    got = targets(tok, t)
    # a reply's surrounding spaces belong to the template's text, not the reply's content
    assert got.replace(" ", "") == want.replace(" ", "")
    assert t.ids.count(tok.bos_token_id) == 1


def test_packed_rows_restart_positions(tok):
    rows = [{"prompt": str(i), "response": "r" * (i + 1)} for i in range(6)]
    cfg = DataConfig(mode="instruction", files=["x.jsonl"], seq_len=64)
    ex = examples_of(rows, tok, cfg, ChatStats())
    packed = to_rows(ex, tok.pad_token_id, packing=True, capacity=64)
    assert len(packed) < len(ex)
    batch = packed.collate([packed[i] for i in range(len(packed))])
    assert "attention_mask" not in batch
    starts = (batch["position_ids"] == 0).sum().item()
    pads = sum(
        1 for r in range(len(packed)) if len(packed[r]["input_ids"]) < batch["input_ids"].shape[1]
    )
    assert starts == len(ex) + pads
    assert int((batch["labels"] != IGNORE).sum()) == sum(
        sum(x != IGNORE for x in lab) for _, lab in ex
    )
    assert torch.equal(batch["input_ids"][0, : len(packed[0]["input_ids"])], packed[0]["input_ids"])


def test_missing_replies_and_ignored_text_fields_are_refused(tok):
    with pytest.raises(StackWiseError, match="'response' is missing or null"):
        to_messages({"prompt": "q", "response": None}, "prompt_response", 4, [])
    with pytest.raises(StackWiseError, match="turn 1 is missing or null"):
        to_messages(
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": None},
                ]
            },
            "messages",
            0,
            [],
        )
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    cfg = DataConfig(mode="instruction", files=["x.jsonl"], text_field="body")
    with pytest.raises(StackWiseError, match=r"data\.text_field names the fields"):
        examples_of(rows, tok, cfg, ChatStats())


def test_errors_name_the_file_and_row(tmp_path, tok):
    from stackwise.chat.sources import load_rows

    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "c", "completion": "d"}\n')
    cfg = DataConfig(mode="instruction", files=[str(path)])
    rows, _ = load_rows(cfg)
    with pytest.raises(StackWiseError, match=r"Example 1 \(row 2 of bad.jsonl\)"):
        examples_of(rows, tok, cfg, ChatStats())


def test_mixed_formats_and_content_parts():
    with pytest.raises(StackWiseError, match="is not a 'messages' row"):
        to_messages({"conversations": [{"from": "human", "value": "q"}]}, "messages", 5, [])
    parts = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c"},
    ]}  # fmt: skip
    assert to_messages(parts, "messages", 0, [])[0]["content"] == "ab"


def test_targets_the_tokenizer_cannot_write_are_counted_and_said():
    """A char tokenizer that never saw digits writes them as <unk>: the header says how many
    target tokens that is, instead of training on them in silence."""
    from stackwise.data.tokenizer import char_tokenizer

    chars = char_tokenizer(["abcdefghijklmnopqrstuvwxyz ,.!?<>|/:_\n"]).to_transformers()
    use_template(chars, None)
    cfg = DataConfig(mode="instruction", files=["x.jsonl"], seq_len=256)
    rows = [{"prompt": "add two and two", "response": "4444 4444"}]
    stats = ChatStats()
    examples_of(rows, chars, cfg, stats)
    assert stats.unknown == 8 and stats.supervised >= 9
    assert "of the target tokens unknown to the tokenizer" in stats.line()
    known = ChatStats()
    examples_of([{"prompt": "add", "response": "four"}], chars, cfg, known)
    assert known.unknown == 0 and "unknown" not in known.line()
