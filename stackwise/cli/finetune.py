"""`stackwise finetune`'s flags: seed 004's command line, parsed into a config by
stackwise.fronts.finetune_flags (which `python -m stackwise.fronts.model_trainer` shares),
from the one table of seed 004's names (stackwise.config.seed_layouts.model_trainer)."""

from stackwise.fronts.finetune_flags import (
    FLAGS,
    PRECISION_FLAGS,
    SWITCHES,
    finetune_config,
    is_finetune_file,
    parse_flags,
)

__all__ = [
    "FLAGS",
    "PRECISION_FLAGS",
    "SWITCHES",
    "finetune_config",
    "is_finetune_file",
    "parse_flags",
]
