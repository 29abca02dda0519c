"""Routed memory layers ("chapters"): the layer, on racks, on Hugging Face models, their router
losses, learning rates, logs, checkpoints and refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hf_fixtures import chat_file, tiny_hf

from stackwise.errors import StackWiseError
from stackwise.model.memory import MemoryLayer, memory_layers

MEMORY = {"chapters": 4, "slots_per_chapter": 8, "top_k": 2, "layers": [0, -1]}


def with_memory(tiny, memory=None, train=None, **sections):
    train = {"enabled_extensions": ["memory"], **(train or {})}
    return tiny(memory={**MEMORY, **(memory or {})}, train=train, **sections)


def open_gates(layers, value=0.5):
    with torch.no_grad():
        for m in layers:
            m.gate.fill_(value)


# -- the layer ----------------------------------------------------------------------------


def test_a_closed_gate_leaves_the_stream_as_it_was_and_still_learns_to_open():
    torch.manual_seed(0)
    layer = MemoryLayer(16, chapters=4, slots=8, top_k=2)
    h = torch.randn(2, 5, 16)
    assert torch.equal(layer(h), h)
    layer(h).square().sum().backward()
    assert layer.gate.grad is not None and layer.gate.grad.abs().sum() > 0
    open_gates([layer])
    assert not torch.allclose(layer(h), h)


def test_each_token_reads_its_top_chapters_as_a_direct_computation_says():
    torch.manual_seed(1)
    layer = MemoryLayer(8, chapters=5, slots=3, top_k=2)
    open_gates([layer], 1.0)
    h = torch.randn(7, 8)
    got = layer.read(h)
    x = torch.nn.functional.rms_norm(h, (8,), layer.norm_weight, layer.eps)
    probs = layer.router(x).softmax(-1)
    q = layer.query(x)
    for t in range(7):
        top = probs[t].topk(2)
        want = torch.zeros(8)
        for w, c in zip(top.values / top.values.sum(), top.indices, strict=True):
            attn = (q[t] @ layer.keys[c].T).softmax(-1)
            want += w * (attn @ layer.values[c])
        assert torch.allclose(got[t], want, atol=1e-5)
    fraction = layer.last_stats["fraction"]
    assert fraction.sum().item() == pytest.approx(1.0) and fraction.numel() == 5


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_router_learns_from_the_lm_loss_alone_once_the_gate_is_open(top_k):
    torch.manual_seed(2)
    layer = MemoryLayer(16, chapters=4, slots=8, top_k=top_k, loss_coefs=(0.0, 0.0, 0.0))
    open_gates([layer])
    layer(torch.randn(3, 6, 16)).square().sum().backward()
    for p in (layer.router.weight, layer.query.weight, layer.keys, layer.values, layer.gate):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_an_empty_batch_and_chapters_without_tokens_still_give_every_gradient():
    layer = MemoryLayer(8, chapters=6, slots=2, top_k=1)
    open_gates([layer])
    layer(torch.randn(1, 2, 8)).sum().backward()  # 2 tokens: most chapters get none
    assert all(p.grad is not None for p in layer.parameters())
    assert layer(torch.randn(0, 8)).shape == (0, 8)


def test_padding_tokens_count_neither_in_the_router_losses_nor_the_load():
    from stackwise.model.routing import router_statistics, routing_scope

    torch.manual_seed(3)
    layer = MemoryLayer(8, chapters=4, slots=2, top_k=1)
    h = torch.randn(2, 6, 8)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    with routing_scope([layer], mask):
        layer(h)
    assert layer.token_mask is None  # for this forward only
    x = torch.nn.functional.rms_norm(h.reshape(-1, 8), (8,), layer.norm_weight, layer.eps)
    logits = layer.router(x)[mask.flatten().bool()]
    want = router_statistics(logits, logits.softmax(-1).topk(1).indices)
    for key in ("fraction", "probability", "z"):
        assert torch.allclose(layer.last_stats[key], want[key])


def test_a_nearly_closed_gate_keeps_its_size_under_fp16():
    torch.manual_seed(4)
    layer = MemoryLayer(16, chapters=4, slots=8, top_k=2)
    open_gates([layer], 1e-5)
    h = torch.randn(2, 8, 16)
    want = layer.read(h)
    got = layer.read(h.half()).float()  # as under fp16 autocast: queries and reads in fp16
    assert torch.allclose(got, want, rtol=2e-2, atol=1e-9)


def test_gradient_checkpointing_replays_routed_layers_on_masked_batches(tiny):
    """The replay in backward must run what the forward ran, with the padding mask gone."""
    from stackwise.pipeline import train_from_config

    model = {"gradient_checkpointing": True, "moe": {"num_experts": 2, "top_k": 1}}
    cfg = with_memory(tiny, model=model, objective={"random_length_ratio": 0.5})
    result = train_from_config(cfg, quiet=True)
    losses = [h["loss"] for h in result.state.history if "loss" in h]
    assert losses and all(math.isfinite(x) for x in losses)
    layers = memory_layers(result.rack)
    assert all(m.last_routing is not None and m.last_routing["keep"] is not None for m in layers)


def test_inserting_memory_into_a_trained_rack_keeps_its_function(tiny):
    from stackwise.model.memory import attach_memory
    from stackwise.pipeline import train_from_config

    trained = train_from_config(tiny(train={"max_steps": 3}), quiet=True).rack.eval()
    ids = torch.randint(4, 300, (2, 16))
    before = trained(ids)
    where = attach_memory(trained, with_memory(tiny))
    assert where == [0, 1] and len(memory_layers(trained)) == 2
    assert torch.equal(trained(ids), before)


# -- on racks -----------------------------------------------------------------------------


def test_a_memory_rack_trains_logs_its_chapters_and_reloads(tiny, tmp_path):
    from stackwise.pipeline import train_from_config
    from stackwise.runs import load_trained

    out = tmp_path / "mem"
    train = {"max_steps": 8, "output_dir": str(out), "save_steps": 4}
    cfg = with_memory(tiny, train=train, logging={"tensorboard": True})
    result = train_from_config(cfg, quiet=True)
    layers = memory_layers(result.rack)
    assert [m.chapters for m in layers] == [4, 4]
    assert all(m.gate.abs().sum() > 0 for m in layers)  # the gates opened
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "train/chapter_load_cv" in r]
    assert logged and all(
        r["train/memory_router_loss"] > 0
        and 0 < r["train/memory_router_entropy"] <= math.log(4) + 1e-6
        and {"train/chapter_load_cv/layer0", "train/chapter_load_cv/layer1"} <= r.keys()
        and r["train/memory_gate"] > 0
        for r in logged
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(out / "tensorboard"))
    board.Reload()
    want = {"train/chapter_load_cv/layer1", "train/memory_router_entropy/layer0"}
    assert want | {"train/memory_gate"} <= set(board.Tags()["scalars"])
    state = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())
    # the memory extension's report goes to the metrics at each save; its state to the state
    shares = [r for r in rows if "report/memory_chapter_shares" in r][-1]
    shares = shares["report/memory_chapter_shares"]
    assert len(shares) == 2 and all(sum(s) == pytest.approx(1.0) for s in shares)
    assert state["extensions"]["memory"]["steps"] == 8
    _, again, _ = load_trained(out)
    ids = torch.randint(4, 60, (2, 16))
    assert torch.equal(result.rack.eval()(ids), again(ids))


def test_a_memory_rack_resumes_bitwise_and_keeps_counting_chapters(tiny, tmp_path):
    from test_checkpoints import crash_then_resume

    from stackwise.pipeline import train_from_config

    def cfg(name, enabled_extensions=(), **train):
        exts = ["memory", *enabled_extensions]
        out = {"save_steps": 2, "max_steps": 6, "output_dir": str(tmp_path / name), **train}
        return with_memory(tiny, train={**out, "enabled_extensions": exts})

    full = train_from_config(cfg("full"), quiet=True)
    resumed = crash_then_resume(cfg, None, 2)
    wa, wb = full.rack.state_dict(), resumed.rack.state_dict()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    counted = [
        json.loads((tmp_path / n / "checkpoint-6" / "trainer_state.json").read_text())
        for n in ("full", "crash")
    ]
    assert counted[0]["extensions"]["memory"] == counted[1]["extensions"]["memory"]


def test_resuming_with_other_memory_is_refused(tiny, tmp_path):
    from stackwise.config import save_config
    from stackwise.io.checkpoints import check_resume_config

    save_config(with_memory(tiny), tmp_path / "config.yaml")
    with pytest.raises(StackWiseError, match=r"memory.chapters 4 -> 8"):
        check_resume_config(tmp_path, with_memory(tiny, memory={"chapters": 8}))
    with pytest.raises(StackWiseError, match="memory layers on -> off"):
        check_resume_config(tmp_path, tiny())
    assert check_resume_config(tmp_path, with_memory(tiny)) is None


def test_the_memory_lr_reaches_the_memory_and_the_router_trains_with_it(tiny):
    from stackwise.config import from_dict
    from stackwise.pipeline import train_from_config
    from stackwise.train.adapters import RackAdapter

    cfg = with_memory(tiny, train={"lr": 1e-3, "group_lr": {"memory": 5e-3}})
    rack = RackAdapter().build(cfg, 300)
    groups = RackAdapter().named_groups(rack)
    names = {n: g for g, params in groups.items() for n, _ in params}
    assert names["stacks.0.blocks.0.memory.router.weight"] == "memory"
    assert names["stacks.0.blocks.1.memory.keys"] == "memory"
    assert names["stacks.0.blocks.0.attn.q_proj.weight"] == "blocks"
    result = train_from_config(cfg, quiet=True)
    lrs = {g["name"]: g["initial_lr"] for g in result.trainer.optimizer.param_groups}
    assert lrs["memory"] == 5e-3 and lrs["memory.no_decay"] == 5e-3 and lrs["blocks"] == 1e-3
    out = cfg.train.output_dir
    rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "train/lr/memory" in r]
    assert logged
    assert all(r["train/lr/memory"] == pytest.approx(5 * r["train/lr/blocks"]) for r in logged)
    seed_names = from_dict({"memory_lr": 1e-4, "train": {"enabled_extensions": ["memory"]}})
    assert seed_names.train.group_lr.memory == 1e-4


def test_every_memory_setting_reaches_the_layers(tiny):
    from stackwise.io.trained import build_rack

    memory = {"chapters": 6, "slots_per_chapter": 3, "top_k": 1, "layers": [1]}
    memory |= {"load_balance_coef": 0.05, "auxiliary_coef": 0.3, "z_loss_coef": 0.2}
    layers = memory_layers(build_rack(with_memory(tiny, memory=memory), 300))
    assert len(layers) == 1 and tuple(layers[0].keys.shape) == (6, 3, 32)
    assert layers[0].top_k == 1 and layers[0].loss_coefs == (0.05, 0.3, 0.2)


def test_an_imported_llama_keeps_its_function_with_memory_inserted(tiny, tmp_path):
    from stackwise.io.trained import build_rack
    from stackwise.model.hf import export_llama
    from stackwise.train.adapters import RackAdapter

    rack = build_rack(tiny(), 300).eval()
    export_llama(rack, tmp_path / "llama")
    cfg = with_memory(tiny, model={"init_from_hf": str(tmp_path / "llama")})
    grown = RackAdapter().build(cfg, 300).eval()
    assert len(memory_layers(grown)) == 2
    ids = torch.randint(4, 300, (2, 16))
    assert torch.allclose(grown(ids), rack(ids), atol=1e-5)


def test_a_memory_rack_does_not_export_to_llama(tiny, tmp_path):
    from stackwise.io.hf_llama import check_exportable
    from stackwise.io.trained import build_rack

    cfg = with_memory(tiny)
    with pytest.raises(StackWiseError, match="memory layers"):
        check_exportable(cfg, build_rack(cfg, 300))


@pytest.mark.parametrize(
    ("sections", "words"),
    [
        ({"memory": {"chapters": 4}}, "add memory to train.enabled_extensions"),
        ({"train": {"group_lr": {"memory": 1e-3}}}, "needs memory in"),
        ({"on": True, "memory": {"top_k": 5, "chapters": 4}}, "exceeds memory.chapters"),
        ({"on": True, "memory": {"layers": [4]}}, "names block 4"),
        ({"on": True, "memory": {"layers": [-5]}}, "names block -5"),
        ({"on": True, "memory": {"layers": [3, -1]}}, "one block twice"),
        ({"on": True, "memory": {"layers": []}}, r"memory\.layers.*at least 1"),
        ({"on": True, "memory": {"chapters": 0}}, r"memory\.chapters.*greater than 0"),
        ({"on": True, "progressive": {"end_to_end_scope": "stackwise"}}, "scope stackwise"),
        ({"on": True, "lora": {"enabled": True}}, "lora.enabled"),
        ({"on": True, "progressive": {"strategy": "progressive"}}, "strategy: end_to_end"),
        ({"on": True, "train": {"compile": True}}, "train.compile"),
        ({"on": True, "quant": {"enabled": True}}, "quant.enabled"),
    ],
)
def test_memory_settings_that_cannot_work_are_refused(sections, words):
    from stackwise.config import from_dict

    sections = dict(sections)
    train = dict(sections.pop("train", {}))
    if sections.pop("on", False):
        train["enabled_extensions"] = ["memory"]
    with pytest.raises(StackWiseError, match=words):
        from_dict({"model": {"n_stacks": 2, "blocks_per_stack": 2}, "train": train, **sections})


# -- on Hugging Face models ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfmem")
    return {
        "model": tiny_hf(root / "m"),
        "chat": chat_file(root / "c.jsonl", n=24),
        "eval": chat_file(root / "e.jsonl", n=4, seed=5),
    }


def hf_config(hf_files, out, lora=None, train=None, model=None, memory=None):
    from stackwise.config import from_dict

    return from_dict(
        {
            "model": {
                "source": "hf",
                "model_name_or_path": str(hf_files["model"]),
                **(model or {}),
            },
            "data": {"mode": "instruction", "files": [str(hf_files["chat"])], "seq_len": 128},
            "lora": {"enabled": True, **(lora or {})},
            "memory": {"chapters": 4, "slots_per_chapter": 4, "layers": [0, 1], **(memory or {})},
            "train": {
                "enabled_extensions": ["memory"],
                "max_steps": 4,
                "batch_size": 4,
                "mixed_precision": "no",
                "output_dir": str(out),
                **(train or {}),
            },
        }
    )


def test_memory_hooked_onto_a_hf_model_keeps_its_function_and_names(hf_files, tmp_path):
    from transformers import AutoModelForCausalLM

    from stackwise.hf.adapter import HFAdapter

    plain = AutoModelForCausalLM.from_pretrained(str(hf_files["model"])).eval()
    model = HFAdapter().build(hf_config(hf_files, tmp_path / "o"), 0).eval()
    ids = torch.randint(4, 200, (2, 12))
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, plain(input_ids=ids).logits)
        layers = memory_layers(model)
        assert len(layers) == 2
        open_gates(layers)
        assert not torch.allclose(model(input_ids=ids).logits, plain(input_ids=ids).logits)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n or "stackwise_memory" in n for n in trained)
    assert any("stackwise_memory" in n for n in trained)
    own = {k for k in model.state_dict() if "stackwise_memory." not in k}
    from peft import get_peft_model_state_dict  # hooks, not wrappers: the names PEFT saves

    assert all(k.split(".lora_")[0] in str(own) for k in get_peft_model_state_dict(model))
    plain_names = {f"base_model.model.{k}" for k in plain.state_dict()}
    assert {k.replace(".base_layer", "") for k in own if ".lora_" not in k} == plain_names
    with pytest.raises(ValueError, match="already"):
        from stackwise.hf.memory import attach_memory_hf

        attach_memory_hf(model, hf_config(hf_files, tmp_path / "o"))


def test_packed_hf_batches_route_their_end_padding_without_counting_it(hf_files, tmp_path):
    from stackwise.chat.data import ChatRows
    from stackwise.hf.adapter import HFAdapter

    adapter = HFAdapter()
    model = adapter.build(hf_config(hf_files, tmp_path / "o"), 0).train()
    rows = [
        {"input_ids": torch.arange(4, 4 + n), "labels": torch.arange(4, 4 + n),
         "position_ids": torch.arange(n)}
        for n in (9, 5)
    ]  # fmt: skip
    batch = ChatRows(rows, 0, packed=True).collate(rows)
    assert batch["real_tokens"].sum() == 14 and "attention_mask" not in batch
    adapter.loss(model, None, batch, torch.Generator(), False)
    for layer in memory_layers(model):
        assert int(layer.last_routing["keep"].sum()) == 14
        assert layer.last_stats["fraction"].sum().item() == pytest.approx(1.0)


def test_hf_groups_take_the_memory_lora_and_base_lrs_by_their_seed_names(hf_files, tmp_path):
    from stackwise.hf.adapter import HFAdapter
    from stackwise.train.optim import build_param_groups

    seed_lrs = {"memory_lr": 2e-4, "lora_lr": 1e-4, "base_model_lr": 1e-5}
    cfg = hf_config(hf_files, tmp_path / "o", lora={"modules_to_save": ["lm_head"]}, train=seed_lrs)
    adapter = HFAdapter()
    model = adapter.build(cfg, 0)
    groups = build_param_groups(adapter.named_groups(model), cfg.train, adapter.group_lr)
    lrs = {g["name"].removesuffix(".no_decay"): g["lr"] for g in groups}
    assert lrs == {"memory": 2e-4, "lora": 1e-4, "base": 1e-5}
    memory_ids = {id(p) for m in memory_layers(model) for p in m.parameters()}
    in_memory = {id(p) for g in groups if g["name"].startswith("memory") for p in g["params"]}
    assert in_memory == memory_ids


def test_a_memory_adapter_on_a_tiny_llama_trains_from_the_cli(hf_files, tmp_path, capsys):
    from stackwise.cli import main

    out = tmp_path / "run"
    flags = [
        "finetune", "--model_name_or_path", str(hf_files["model"]), "--train_file",
        str(hf_files["chat"]), "--eval_file", str(hf_files["eval"]), "--use_lora", "False",
        "--max_steps", "6", "--learning_rate", "1e-2", "--output_dir", str(out),
        "--logging_steps", "2", "--eval_steps", "3", "--save_steps", "3", "--bf16", "False",
        "train.enabled_extensions=[memory]", "memory.layers=[1]", "memory.chapters=4",
        "sample.num_samples=1", "sample.max_new_tokens=4",
    ]  # fmt: skip
    assert main(flags) == 0
    printed = capsys.readouterr().out
    header = "its weights frozen + memory after decoder layer(s) 1 (4 chapters x 16 slots"
    assert header in printed
    assert "memory after layer 1: chapter load CV" in printed
    assert (out / "memory.safetensors").is_file() and not (out / "model.safetensors").exists()
    assert "memory.safetensors" in (out / "README.md").read_text()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r["val/loss"] for r in rows if "val/loss" in r]
    assert evals[-1] < evals[0]  # only the memory trained, and it helped
    assert any("train/chapter_load_cv/layer1" in r for r in rows)  # named by decoder layer
    chat = ["generate", "--checkpoint", str(out), "--chat", "Repeat: sun", "--max-new-tokens", "3"]
    assert main(chat) == 0
    capsys.readouterr()
    resumed = tmp_path / "resumed"
    again = [*flags[: flags.index("--output_dir") + 1], str(resumed)]
    again += flags[flags.index("--output_dir") + 2 :]
    again += ["--resume_from_checkpoint", str(out / "checkpoint-3")]
    assert main(again) == 0
    capsys.readouterr()
    from safetensors.torch import load_file

    a, b = (
        load_file(str(out / "memory.safetensors")),
        load_file(str(resumed / "memory.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["merge-lora", str(out), str(tmp_path / "merged")]) != 0
    assert "no place for them" in capsys.readouterr().err


def test_memory_on_a_4bit_base_trains_with_lora(hf_files, tmp_path, bnb_cpu_path):
    from stackwise.pipeline import train_from_config

    cfg = hf_config(hf_files, tmp_path / "q", model={"load_in_4bit": True})
    result = train_from_config(cfg, quiet=True)
    layers = memory_layers(result.trainer.raw_model)
    assert len(layers) == 2 and all(m.gate.abs().sum() > 0 for m in layers)
    assert (tmp_path / "q" / "memory.safetensors").is_file()
    assert (tmp_path / "q" / "adapter_model.safetensors").is_file()


def test_a_typo_of_the_memory_extension_is_named():
    from stackwise.config import from_dict

    with pytest.raises(StackWiseError, match=r"lists 'memroy': a typo of memory"):
        from_dict({"train": {"enabled_extensions": ["memroy"]}, "memory": {"chapters": 4}})
    from_dict({"train": {"enabled_extensions": ["memory_log"]}})  # a name of its own: fine


def test_hf_resume_accepts_the_same_layers_named_from_the_end(hf_files, tmp_path):
    from stackwise.config import save_config
    from stackwise.io.checkpoints import check_resume_config

    save_config(hf_config(hf_files, tmp_path, memory={"layers": [-1]}), tmp_path / "config.yaml")
    assert (
        check_resume_config(tmp_path, hf_config(hf_files, tmp_path, memory={"layers": [1]})) is None
    )


def test_hf_memory_refusals(hf_files, tmp_path):
    from stackwise.hf.adapter import HFAdapter

    with pytest.raises(StackWiseError, match="save_merged"):
        hf_config(hf_files, tmp_path, lora={"save_merged": True})
    with pytest.raises(StackWiseError, match="base is frozen"):
        hf_config(hf_files, tmp_path, lora={"enabled": False}, train={"base_model_lr": 1e-5})
    cfg = hf_config(hf_files, tmp_path, memory={"layers": [2]})
    with pytest.raises(StackWiseError, match="names decoder layer 2; there are 2"):
        HFAdapter().build(cfg, 0)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "memory-only"])
def test_a_saved_hf_memory_run_reloads_to_the_same_outputs(hf_files, tmp_path, lora):
    from stackwise.pipeline import train_from_config
    from stackwise.runs import load_finetuned

    cfg = hf_config(hf_files, tmp_path / "r", lora={"enabled": lora}, train={"lr": 1e-2})
    model = train_from_config(cfg, quiet=True).trainer.raw_model.eval()
    _, again, _ = load_finetuned(tmp_path / "r")
    ids = torch.randint(4, 200, (2, 12))
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, again(input_ids=ids).logits)
    assert len(memory_layers(again)) == 2 and all(
        m.gate.abs().sum() > 0 for m in memory_layers(again)
    )


def test_memory_only_on_a_4bit_bf16_base(hf_files, tmp_path):
    from stackwise.pipeline import train_from_config

    cfg = hf_config(
        hf_files,
        tmp_path / "q",
        lora={"enabled": False},
        model={"load_in_4bit": True, "dtype": "bf16"},
        train={"lr": 1e-2},
    )
    result = train_from_config(cfg, quiet=True)
    model = result.trainer.raw_model
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("stackwise_memory." in n for n in trained)
    history = [h["loss"] for h in result.state.history if "loss" in h]
    assert all(math.isfinite(x) for x in history)
    assert all(m.gate.abs().sum() > 0 for m in memory_layers(model))


def test_a_memory_rack_saved_as_stacks_only_reloads(tiny, tmp_path):
    from stackwise.pipeline import train_from_config
    from stackwise.runs import load_trained

    out = tmp_path / "stacks"
    cfg = with_memory(tiny, train={"output_dir": str(out)}, progressive={"save_rack": False})
    result = train_from_config(cfg, quiet=True)
    assert not (out / "model.safetensors").exists()
    _, again, _ = load_trained(out)
    ids = torch.randint(4, 60, (2, 16))
    assert torch.equal(result.rack.eval()(ids), again(ids))
