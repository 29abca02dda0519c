"""Seed 002 (the enhanced training system): the training config's attributes it sets."""

from __future__ import annotations

from stackwise.config.seed_layouts import Layout, keys

LAYOUT = Layout(
    seed="002",
    title="enhanced training system: training_config attributes",
    keys=keys({"enabled_extensions": "train.enabled_extensions"}),
)
