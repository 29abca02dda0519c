"""`stackwise export-hf`: a causal rack becomes a Llama checkpoint that transformers loads with
the same logits; what a Llama cannot hold is refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from stackwise.cli import main
from stackwise.config import from_dict
from stackwise.errors import StackWiseError
from stackwise.pipeline import train_from_config
from stackwise.runs import export_hf, load_trained


@pytest.mark.parametrize(
    "model",
    [
        {"n_stacks": 2, "blocks_per_stack": 1},  # tied head, blocks across two stacks
        {"n_kv_heads": 1, "tie_embeddings": False, "ffn_hidden": 48},  # GQA, own head
    ],
)
def test_a_causal_rack_loads_in_transformers_with_the_same_logits(tiny, tmp_path, model):
    res = train_from_config(tiny(model=model, train={"max_steps": 2}), quiet=True)
    out = tmp_path / "llama"
    assert main(["export-hf", str(res.output_dir), str(out)]) == 0
    config, rack, tok = load_trained(res.output_dir)
    hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    hf_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ids = torch.tensor([tok("the king shall never speak", add_special_tokens=False)["input_ids"]])
    assert (
        hf_tok("the king shall never speak", add_special_tokens=False)["input_ids"]
        == ids[0].tolist()
    )
    with torch.no_grad():
        ours = rack.float()(ids)
        theirs = hf(input_ids=ids).logits
    assert theirs.shape == ours.shape
    assert (ours - theirs).abs().max().item() < 1e-4
    assert hf.config.tie_word_embeddings == config.model.tie_embeddings
    assert hf.config.num_hidden_layers == config.model.n_stacks * config.model.blocks_per_stack


def test_a_masked_rack_exports_with_a_note_and_a_time_conditioned_one_is_refused(
    tiny, tmp_path, capsys
):
    masked = tiny(objective={"name": "diffusion"}, train={"max_steps": 2})
    plain = train_from_config(masked, quiet=True)
    out = tmp_path / "llama-d"
    assert main(["export-hf", str(plain.output_dir), str(out)]) == 0
    note = json.loads((out / "config.json").read_text())["stackwise_note"]
    assert "bidirectional diffusion" in note and "bidirectional" in capsys.readouterr().err
    assert main(["export-hf", str(plain.output_dir), str(out)]) == 2  # never written over
    assert "not empty" in capsys.readouterr().err
    timed = train_from_config(
        tiny(
            objective={"name": "diffusion"},
            model={"time_conditioning": "sinusoidal"},
            train={"max_steps": 2, "output_dir": str(tmp_path / "t")},
        ),
        quiet=True,
    )
    with pytest.raises(StackWiseError, match="time-conditioned"):
        export_hf(timed.output_dir, tmp_path / "llama-t")
    assert not (tmp_path / "llama-t").exists()


@pytest.fixture
def imported(corpus_file, cache_dir, tmp_path):
    """imported(llama_dir, **sections) -> a tiny config starting from that Llama."""

    def build(llama, build=True, **sections):
        model = {"init_from_hf": str(llama), **sections.pop("model", {})}
        train = {"output_dir": str(tmp_path / "imported"), **sections.pop("train", {})}
        data = tiny_dict(corpus_file, cache_dir, tmp_path, model=model, train=train, **sections)
        data["data"].pop("bpe_vocab_size")  # the checkpoint brings its tokenizer
        return from_dict(data) if build else data

    return build


def test_an_exported_llama_imports_back_as_the_same_rack_and_trains(tiny, imported, tmp_path):
    first = train_from_config(tiny(train={"max_steps": 4}), quiet=True)
    llama = tmp_path / "llama"
    export_hf(first.output_dir, llama)
    again = train_from_config(imported(llama), quiet=True)
    # the imported rack scores the validation set exactly as the run it came from ended
    assert again.state.history[0]["loss"] == pytest.approx(
        first.state.history[-1]["loss"], abs=1e-5
    )
    assert again.config.model.d_model == first.config.model.d_model
    assert again.config.data.tokenizer == str(llama)


def test_an_imported_causal_trunk_adapts_to_diffusion(tiny, imported, tmp_path):
    first = train_from_config(tiny(train={"max_steps": 4}), quiet=True)
    llama = tmp_path / "llama"
    export_hf(first.output_dir, llama)
    cfg = imported(
        llama,
        objective={"name": "diffusion"},
        train={"max_steps": 30, "eval_every": 30, "lr": 3e-3},
        sample={"steps": 4},
    )
    res = train_from_config(cfg, quiet=True)
    assert res.rack.causal is False
    assert res.state.history[-1]["loss"] < res.state.history[0]["loss"] - 0.1


@pytest.mark.parametrize(
    ("sections", "match"),
    [
        ({"model": {"d_model": 64}}, r"model.d_model=64 \(the checkpoint has 32\)"),
        ({"model": {"blocks_per_stack": 3}}, "does not divide"),
        ({"progressive": {"strategy": "progressive"}}, "grows stacks on the imported"),
    ],
)
def test_init_from_hf_refuses_what_it_cannot_honour(tiny, imported, tmp_path, sections, match):
    first = train_from_config(tiny(train={"max_steps": 2}), quiet=True)
    llama = tmp_path / "llama"
    export_hf(first.output_dir, llama)
    with pytest.raises(StackWiseError, match=match):
        train_from_config(imported(llama, **sections), quiet=True)


def test_progressive_growth_on_an_imported_frozen_trunk(tiny, imported, tmp_path):
    """A 2-layer Llama becomes the frozen first two stacks; one more stack grows on top."""
    first = train_from_config(
        tiny(model={"n_stacks": 2, "blocks_per_stack": 1}, train={"max_steps": 4}), quiet=True
    )
    llama = tmp_path / "llama"
    export_hf(first.output_dir, llama)
    cfg = imported(
        llama,
        model={"blocks_per_stack": 1, "n_stacks": 3},
        progressive={"strategy": "progressive"},
        train={"max_steps": 6},
    )
    res = train_from_config(cfg, quiet=True)
    assert len(res.rack.stacks) == 3 and len(res.progressive.stacks) == 1  # one grown stage
    before, after = first.rack.state_dict(), res.rack.state_dict()
    for name, value in before.items():  # the imported trunk and anchor did not move
        assert torch.equal(value, after[name]), name
    grown = [k for k in after if k.startswith("stacks.2.")]
    assert grown and all(k not in before for k in grown)
    _, back, _ = load_trained(res.output_dir)
    ids = torch.randint(4, 100, (1, 12))
    with torch.no_grad():
        assert torch.allclose(back.float()(ids), res.rack.float()(ids), atol=1e-5)
    assert (res.output_dir / "stacks" / "stack_0.safetensors").is_file()


@pytest.mark.parametrize(
    "growth",
    [{}, {"trunk_strategy": "full", "head_policy": "always"}],
    ids=["frozen-trunk", "trained-trunk-and-head"],
)
def test_growth_on_an_imported_trunk_resumes_bitwise(tiny, imported, tmp_path, growth):
    """Killed mid-way through the second grown stack (after a finished one): the resumed run
    re-imports the trunk, regrows the finished stack, takes back what the stages trained (the
    imported stacks and head too, when they train) and ends bit for bit where an uninterrupted
    run ends."""
    from test_checkpoints import crash_then_resume

    first = train_from_config(
        tiny(model={"n_stacks": 2, "blocks_per_stack": 1}, train={"max_steps": 2}), quiet=True
    )
    llama = tmp_path / "llama"
    export_hf(first.output_dir, llama)

    def cfg(name, **train):
        data = imported(
            llama,
            build=False,
            model={"blocks_per_stack": 1, "n_stacks": 4, "dropout": 0.1},
            progressive={"strategy": "progressive", "steps_per_stack": 4, **growth},
            train={"save_steps": 2, "output_dir": str(tmp_path / name), **train},
        )
        data["train"].pop("max_steps", None)  # each stack's budget is steps_per_stack
        return from_dict(data)

    full = train_from_config(cfg("full"), quiet=True)
    resumed = crash_then_resume(cfg, 3, 2)
    wa, wb = full.rack.state_dict(), resumed.rack.state_dict()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    assert [r.eval for r in full.progressive.stacks] == [r.eval for r in resumed.progressive.stacks]
    assert len(resumed.progressive.stacks) == 2


def test_a_non_llama_checkpoint_is_refused(tmp_path):
    from stackwise.io.hf_llama import read_llama_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    with pytest.raises(StackWiseError, match="'mistral' model"):
        read_llama_config(tmp_path)


def test_export_into_a_file_is_refused(tiny, tmp_path):
    res = train_from_config(tiny(train={"max_steps": 2}), quiet=True)
    with pytest.raises(StackWiseError, match="is a file; OUT must be a new folder"):
        export_hf(res.output_dir, res.output_dir / "model.safetensors")


def test_a_qwen2_checkpoint_imports_with_its_attention_biases(imported, tmp_path):
    """Qwen2's q/k/v biases become the rack's (model.attention_bias); the rack gives the
    checkpoint's logits, and exports back as a Qwen2."""
    from hf_fixtures import tiny_hf

    qwen = tiny_hf(tmp_path / "qwen", kind="qwen2")
    hf = AutoModelForCausalLM.from_pretrained(qwen, local_files_only=True).eval()
    with torch.no_grad():
        for layer in hf.model.layers:  # non-zero biases, so a dropped one would show
            layer.self_attn.q_proj.bias.normal_(std=0.5)
            layer.self_attn.k_proj.bias.normal_(std=0.5)
            layer.self_attn.v_proj.bias.normal_(std=0.5)
    hf.save_pretrained(str(qwen))
    base = imported(qwen, model={"blocks_per_stack": 1}, train={"max_steps": 1}, build=False)
    base["model"] = {"init_from_hf": str(qwen), "blocks_per_stack": 1}  # its shape, not tiny's
    base["data"]["seq_len"] = 32
    cfg = from_dict(base)
    res = train_from_config(cfg, quiet=True)
    assert res.config.model.attention_bias and res.config.model.n_stacks == 2
    from stackwise.pipeline import with_hf_shape
    from stackwise.train.adapters import RackAdapter

    shaped = with_hf_shape(cfg)
    fresh = RackAdapter().build(shaped, shaped.model.vocab_size).eval()  # the import, untrained
    ids = torch.randint(4, 200, (1, 16))
    with torch.no_grad():
        assert (fresh(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-4
    out = tmp_path / "back"
    export_hf(res.output_dir, out)
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    back = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    _, rack, _ = load_trained(res.output_dir)
    with torch.no_grad():
        assert (rack.float()(ids) - back(input_ids=ids).logits).abs().max().item() < 1e-4
