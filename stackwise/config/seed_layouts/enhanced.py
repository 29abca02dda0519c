"""Seed 002 (the enhanced training system): the training config's attributes it sets and
reads: the extensions to turn on, and the stages its example curriculum strategy reads (a
setting of a strategy of the user's own, kept in train.strategy_options)."""

from __future__ import annotations

from stackwise.config.seed_layouts import Layout, SeedKey, keys

LAYOUT = Layout(
    seed="002",
    title="enhanced training system: training_config attributes",
    keys=keys(
        {
            "enabled_extensions": "train.enabled_extensions",
            "curriculum_stages": SeedKey(
                "train.strategy_options.curriculum_stages",
                note="read by a curriculum strategy of your own; StackWise's strategies "
                "read no strategy option",
            ),
        }
    ),
)
