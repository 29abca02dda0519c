"""The extension points of docs/architecture.md, each used the way the recipe says: a toy model
adapter and a toy (curriculum) strategy are registered and trained with from a config."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from torch import nn

import stackwise
from stackwise.data.pack import TokenBlocks
from stackwise.errors import StackWiseError
from stackwise.objectives import build_objective


class Bigram(nn.Module):
    """Each token's logits depend on that token only: a causal model by construction."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, input_ids, attention_mask=None, t=None):
        return self.table(input_ids)


@stackwise.register_model_adapter("toy_bigram")
class BigramAdapter(stackwise.ModelAdapter):
    def build(self, config, vocab_size):
        return Bigram(vocab_size)


@stackwise.register_training_strategy("toy_curriculum")
class Curriculum(stackwise.TrainingStrategy):
    """Half the steps on the first half of every sequence, then the rest on whole sequences."""

    phases: ClassVar[list[tuple[int, int]]] = []  # (sequence length, steps), read by the test

    def run(self, config, data, adapter, quiet):
        model = adapter.build(config, config.model.vocab_size)
        objective = build_objective(config, data.specials)
        half = config.train.max_steps // 2
        short = TokenBlocks(data.train.blocks[:, : config.data.seq_len // 2])
        state = None
        for name, train_data, steps in (("short", short, half), ("full", data.train, None)):
            phase = config.with_section(  # the run's Plan, with this phase's budget and folder
                "train",
                max_steps=steps or config.train.max_steps - half,
                output_dir=f"{config.train.output_dir}/{name}",
            )
            trainer = stackwise.build_trainer(
                phase, model, objective, train_data, data.val, adapter=adapter, strategy=self
            )
            state = trainer.train()
            Curriculum.phases.append((train_data[0]["input_ids"].shape[0], state.step))
        trainer.save(data.tokenizer)
        return stackwise.RunResult(config, trainer.output_dir, model, data, state, trainer)


def test_a_registered_strategy_and_adapter_train_from_a_config(tiny):
    Curriculum.phases = []
    cfg = tiny(objective={"name": "clm"}, train={"max_steps": 6})
    res = stackwise.train_from_config(
        cfg, quiet=True, strategy="toy_curriculum", adapter="toy_bigram"
    )
    assert Curriculum.phases == [(16, 3), (32, 3)]  # short sequences first, then whole ones
    assert isinstance(res.rack, Bigram)
    history = res.state.history
    assert history[-1]["loss"] < history[0]["loss"]  # the second phase still learns
    assert (res.output_dir / "model.safetensors").is_file()  # saved through the adapter


def test_unknown_names_fail_before_any_work(tiny):
    with pytest.raises(StackWiseError, match=r"No training strategy .*'nope'.*standard"):
        stackwise.train_from_config(tiny(), strategy="nope")
    with pytest.raises(StackWiseError, match=r"No model adapter .*'nope'.*rack"):
        stackwise.train_from_config(tiny(), adapter="nope")


def test_progressive_growth_refuses_a_model_it_cannot_grow(tiny):
    cfg = tiny(
        objective={"name": "clm"},
        model={"n_stacks": 2, "blocks_per_stack": 1},
        progressive={"strategy": "progressive"},
    )
    with pytest.raises(StackWiseError, match="cannot be grown"):
        stackwise.train_from_config(cfg, quiet=True, adapter="toy_bigram")


def test_the_rack_adapter_loads_what_it_saved(tiny):
    res = stackwise.train_from_config(tiny(train={"max_steps": 2}), quiet=True, adapter="rack")
    from stackwise.runs import read_plan

    config, rack, tok = stackwise.get_model_adapter("rack").load(res.output_dir, read_plan)
    assert config.model == res.config.model and len(tok) == len(res.data.tokenizer)
    saved, trained = rack.state_dict(), res.rack.state_dict()
    assert all(torch.equal(saved[k], trained[k].cpu()) for k in trained)


def test_the_built_in_strategies_are_registered():
    assert {"standard", "local_losses", "progressive"} <= set(stackwise.strategies.STRATEGIES)
    assert isinstance(stackwise.get_model_adapter("rack"), stackwise.ModelAdapter)


def test_module_colon_name_imports_the_extension_module_first(tmp_path, monkeypatch):
    """`train.enabled_extensions: [module:name]` imports `module` (which registers `name`), so
    the command line can use an extension written in the user's own file; mistakes are one
    paragraph each. (tests/test_readme.py runs docs/python_api.md's example from the CLI, in a
    subprocess with PYTHONPATH.)"""
    from stackwise.train.extensions import REGISTRY, build_extensions

    (tmp_path / "sw_ext_probe.py").write_text(
        "import stackwise\n\n\n@stackwise.register_extension('sw_probe')\n"
        "class Probe(stackwise.Extension):\n    pass\n"
    )
    (tmp_path / "sw_ext_empty.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(REGISTRY, "sw_probe", raising=False)
    (ext,) = build_extensions(["sw_ext_probe:sw_probe"])
    assert ext.name == "sw_probe"
    cases = {
        "sw_no_such_module:x": "cannot be imported",
        "sw_ext_empty:sw_other": "registers no extension 'sw_other'",
        ":x": "is malformed",
        "sw_unregistered": "module:name",
    }
    for entry, needle in cases.items():
        with pytest.raises(StackWiseError) as err:
            build_extensions([entry])
        assert needle in " ".join(str(err.value).split()), entry
    monkeypatch.delitem(REGISTRY, "sw_probe")
