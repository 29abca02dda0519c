import json

from stackwise.pipeline import train_from_config


def test_tiny_run_trains_and_saves(tiny):
    result = train_from_config(tiny(train={"max_steps": 6}), quiet=True)
    out = result.output_dir
    assert (out / "model.safetensors").is_file()
    assert (out / "config.yaml").is_file()
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    history = json.loads((out / "history.json").read_text())
    assert history["steps"] == 6
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in r for r in rows) and any("val/loss" in r for r in rows)
