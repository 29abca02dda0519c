"""Rules for data.streaming: what a corpus read once, in order, per epoch can and cannot do."""

from __future__ import annotations

from collections.abc import Iterator

from stackwise.config.base import cross_rule
from stackwise.config.root import Config
from stackwise.config.sections import DataConfig


@cross_rule
def streaming(cfg: Config) -> Iterator[str]:
    """A stream has no length, no random access and no second pass before training."""
    d = cfg.data
    if not d.streaming:
        if d.changed("stream_val_blocks"):
            yield "data.stream_val_blocks sizes a streamed validation set; set data.streaming"
        return
    if d.mode != "pretraining" or cfg.model.source == "hf":
        yield (
            "data.streaming reads a pretraining corpus for a rack; instruction data and "
            "Hugging Face fine-tuning read their rows whole. Remove data.streaming"
        )
        return
    yield from _one_pass(d)
    yield from _no_length(cfg)
    yield from _no_random_access(cfg)


def _one_pass(d: DataConfig) -> Iterator[str]:
    """The source, tokenizer, validation split and readers of a corpus read once, in order."""
    if d.source != "files" or d.mix:
        yield (
            "data.streaming reads one source of your own (data.files, dataset_dir or "
            "dataset_name); the built-in corpus is small enough for the token store, and a "
            "data.mix is drawn by weight from stores. Remove data.streaming or set the source"
        )
    if d.tokenizer in (None, "char"):
        yield (
            f"data.streaming never reads the whole corpus before training, but data.tokenizer "
            f"{d.tokenizer or 'unset (a BPE trained on the corpus)'} would need a pass over it "
            "to learn its vocabulary. Set data.tokenizer: byte, or a tokenizer folder (one a "
            "previous run saved, for example)"
        )
    if d.changed("val_fraction"):
        yield (
            "data.val_fraction is a share of a corpus whose length a stream does not know; "
            "with data.streaming set data.stream_val_blocks (the first blocks validate)"
        )
    if d.num_workers > 1:
        yield (
            "a stream is read in order by one reader: data.num_workers 1 moves it off the "
            "training process; more would each read the whole stream. Set 0 or 1"
        )


def _no_length(cfg: Config) -> Iterator[str]:
    """Budgets counted in epochs need the corpus's length."""
    p = cfg.progressive
    budgets = {
        "train.num_train_epochs": cfg.train.num_train_epochs,
        "progressive.epochs_per_stack": p.epochs_per_stack,
    }
    epochs = [k for k, v in budgets.items() if v is not None]
    epochs += [f"progressive.stacks.{k}.epochs" for k, s in p.stacks.items() if s.epochs]
    if epochs:
        yield (
            f"{', '.join(epochs)} counts epochs of a corpus whose length a stream does not "
            "know; with data.streaming give steps instead: train.max_steps (progressive: "
            "progressive.steps_per_stack, or progressive.stacks.<k>.steps)"
        )


def _no_random_access(cfg: Config) -> Iterator[str]:
    """A sliced split and the activation cache need rows by index."""
    d = cfg.data
    if d.dataset_name and "[" in d.dataset_split:
        yield (
            f"data.dataset_split '{d.dataset_split}' is a slice, which a stream cannot read "
            "without materializing the whole split first; name a whole split"
        )
    if cfg.progressive.cache.enabled:
        yield (
            "progressive.cache keys the trunk's outputs by sample index, which a stream "
            "does not have; disable progressive.cache or data.streaming"
        )
