"""The configuration: one pydantic tree, loaded from YAML/JSON plus dotted overrides.

Every field is consumed somewhere. Fields that only matter for some settings are refused when
changed from their default while irrelevant, so a key never silently does nothing; every rule
runs and all problems are reported together.

- `sections` (with `sections_model`, `sections_train`), `growth`: the schema, one class per
  section; `root`: the whole config.
- `rules`, `rules_progressive` (inside a section), `rules_cross` (across sections),
  `rules_growth`, `rules_schedule`, `rules_hf`, `rules_moe`, `rules_stream`,
  `rules_parallel`, `rules_deepspeed`, `rules_blocks`: named rules.
- `aliases`: the seeds' legacy names; `loading`: files, overrides, errors; `derive`: configs
  made from configs.
"""

from stackwise.config import (  # noqa: F401
    rules,
    rules_blocks,
    rules_cross,
    rules_deepspeed,
    rules_growth,
    rules_hf,
    rules_moe,
    rules_parallel,
    rules_progressive,
    rules_schedule,
    rules_stream,
)
from stackwise.config.aliases import KEY_ALIASES, VALUE_ALIASES, alias_table, apply_aliases
from stackwise.config.base import Section
from stackwise.config.derive import derive, stack_config
from stackwise.config.growth import (
    QUANTIZED,
    CacheConfig,
    GrowthConfig,
    LoraConfig,
    LoraStackSetting,
    PrecisionName,
    ProgressiveConfig,
    QuantConfig,
    RankPattern,
    StackOverride,
)
from stackwise.config.loading import (
    apply_overrides,
    format_validation,
    from_dict,
    load_config,
    parse_override,
    read_file,
    save_config,
)
from stackwise.config.root import Config
from stackwise.config.sections import (
    DataConfig,
    GroupLR,
    LoggingConfig,
    MaskingConfig,
    ModelConfig,
    ObjectiveConfig,
    SampleConfig,
    SchedulerName,
    TrainConfig,
)

__all__ = [
    "KEY_ALIASES",
    "QUANTIZED",
    "VALUE_ALIASES",
    "CacheConfig",
    "Config",
    "DataConfig",
    "GroupLR",
    "GrowthConfig",
    "LoggingConfig",
    "LoraConfig",
    "LoraStackSetting",
    "MaskingConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "PrecisionName",
    "ProgressiveConfig",
    "QuantConfig",
    "RankPattern",
    "SampleConfig",
    "SchedulerName",
    "Section",
    "StackOverride",
    "TrainConfig",
    "alias_table",
    "apply_aliases",
    "apply_overrides",
    "derive",
    "format_validation",
    "from_dict",
    "load_config",
    "parse_override",
    "read_file",
    "save_config",
    "stack_config",
]
