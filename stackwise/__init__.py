"""StackWise: train transformer language models stack by stack.

The public API lives here; everything else is an implementation detail. Names load on first use
(PEP 562), so `stackwise --help` and `stackwise config show` do not pay for torch and
transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Before anything can run a bf16 matmul: on VMs whose AMX kernels trap, oneDNN must be capped
# first (see stackwise.hwprobe). A warm check is a file read, and imports no torch.
from stackwise.hwprobe import ensure_bf16_ready
from stackwise.lazy_exports import lazy_exports

ensure_bf16_ready()

__version__ = "0.1.0"

_EXPORTS = {
    "stackwise.config": ("Config", "load_config", "save_config"),
    "stackwise.data": ("PreparedData", "build_data"),
    "stackwise.errors": ("StackWiseError",),
    "stackwise.generate": ("sample_texts",),
    "stackwise.model": ("Block", "Rack", "Stack"),
    "stackwise.model.hf": ("export_llama",),
    "stackwise.model.memory": ("MemoryLayer",),
    "stackwise.fronts.memory": ("MemoryAdapter",),
    "stackwise.model.moe": ("MoEFeedForward",),
    "stackwise.model.routing": ("compute_router_auxiliary_loss",),
    "stackwise.objectives": ("Objective", "Specials", "build_objective"),
    "stackwise.progressive": ("ActivationCache", "GrowingRack", "ProgressiveRecipe", "depth_range"),
    "stackwise.fronts.progressive": (
        "ProgressiveDataLoader",
        "ProgressiveRackBuilder",
        "ProgressiveTrainer",
        "TimeStepMasking",
        "compute_loss",
        "create_stack_from_config",
    ),
    "stackwise.quant": ("add_adapter", "merge_adapters", "quantize_linears", "weight_bytes"),
    "stackwise.registry": (
        "register_growth_operator",
        "register_objective",
        "register_parallelizer",
        "register_sampler",
        "register_schedule",
    ),
    "stackwise.runs": ("load_trained", "merge_checkpoint"),
    "stackwise.data.plain_tokenizer": ("PlainTokenizer", "as_transformers"),
    "stackwise.report": ("load_run", "write_report"),
    "stackwise.strategies": (
        "FinetuningStrategy",
        "RunResult",
        "StandardTrainingStrategy",
        "TrainingStrategy",
        "get_training_strategy",
        "register_training_strategy",
    ),
    "stackwise.io.trained": ("build_rack",),
    "stackwise.plan": ("compile_plan",),
    "stackwise.spec": ("Plan",),
    "stackwise.pipeline": ("progressive_recipe", "train_from_config", "trainer_for"),
    "stackwise.train": ("CheckpointManager", "ExtensionManager", "MetricsLogger", "build_trainer"),
    "stackwise.fronts.trainer": ("EnhancedTrainer", "Trainer"),
    "stackwise.fronts.model_trainer": ("ModelTrainer", "ReasoningDataset"),
    "stackwise.fronts.data": ("TextDataset", "create_dataloader"),
    "stackwise.config.seed_config": ("StackWiseConfig", "TrainingConfig"),
    "stackwise.config.growth": ("ProgressiveConfig",),
    "stackwise.fronts.unified": ("UnifiedResult", "UnifiedTrainer"),
    "stackwise.train.adapters": (
        "DialogueModelAdapter",
        "ModelAdapter",
        "StandardModelAdapter",
        "register_model_adapter",
    ),
    "stackwise.fronts.components": ("get_model_adapter",),
    "stackwise.fronts.factory": ("TrainerFactory",),
    "stackwise.train.extensions": ("Extension", "register_extension"),
}
__getattr__, __dir__, _NAMES = lazy_exports(__name__, globals(), _EXPORTS)
__all__ = sorted([*_NAMES, "__version__"])


if TYPE_CHECKING:  # static tools see the real names
    from stackwise.config import Config, load_config, save_config  # noqa: F401
    from stackwise.config.growth import ProgressiveConfig  # noqa: F401
    from stackwise.config.seed_config import StackWiseConfig, TrainingConfig  # noqa: F401
    from stackwise.data import PreparedData, build_data  # noqa: F401
    from stackwise.data.plain_tokenizer import PlainTokenizer, as_transformers  # noqa: F401
    from stackwise.errors import StackWiseError  # noqa: F401
    from stackwise.fronts.components import get_model_adapter  # noqa: F401
    from stackwise.fronts.data import TextDataset, create_dataloader  # noqa: F401
    from stackwise.fronts.factory import TrainerFactory  # noqa: F401
    from stackwise.fronts.memory import MemoryAdapter  # noqa: F401
    from stackwise.fronts.model_trainer import ModelTrainer, ReasoningDataset  # noqa: F401
    from stackwise.fronts.progressive import (  # noqa: F401
        ProgressiveDataLoader,
        ProgressiveRackBuilder,
        ProgressiveTrainer,
        TimeStepMasking,
        compute_loss,
        create_stack_from_config,
    )
    from stackwise.fronts.trainer import EnhancedTrainer, Trainer  # noqa: F401
    from stackwise.fronts.unified import UnifiedResult, UnifiedTrainer  # noqa: F401
    from stackwise.generate import sample_texts  # noqa: F401
    from stackwise.io.trained import build_rack  # noqa: F401
    from stackwise.model import Block, Rack, Stack  # noqa: F401
    from stackwise.model.hf import export_llama  # noqa: F401
    from stackwise.model.memory import MemoryLayer  # noqa: F401
    from stackwise.model.moe import MoEFeedForward  # noqa: F401
    from stackwise.model.routing import compute_router_auxiliary_loss  # noqa: F401
    from stackwise.objectives import Objective, Specials, build_objective  # noqa: F401
    from stackwise.pipeline import (  # noqa: F401
        progressive_recipe,
        train_from_config,
        trainer_for,
    )
    from stackwise.plan import compile_plan  # noqa: F401
    from stackwise.progressive import (  # noqa: F401
        ActivationCache,
        GrowingRack,
        ProgressiveRecipe,
        depth_range,
    )
    from stackwise.quant import (  # noqa: F401
        add_adapter,
        merge_adapters,
        quantize_linears,
        weight_bytes,
    )
    from stackwise.registry import (  # noqa: F401
        register_growth_operator,
        register_objective,
        register_parallelizer,
        register_sampler,
        register_schedule,
    )
    from stackwise.runs import load_trained, merge_checkpoint  # noqa: F401
    from stackwise.spec import Plan  # noqa: F401
    from stackwise.strategies import (  # noqa: F401
        FinetuningStrategy,
        RunResult,
        StandardTrainingStrategy,
        TrainingStrategy,
        get_training_strategy,
        register_training_strategy,
    )
    from stackwise.train import (  # noqa: F401
        CheckpointManager,
        ExtensionManager,
        MetricsLogger,
        build_trainer,
    )
    from stackwise.train.adapters import (  # noqa: F401
        DialogueModelAdapter,
        ModelAdapter,
        StandardModelAdapter,
        register_model_adapter,
    )
    from stackwise.train.extensions import Extension, register_extension  # noqa: F401
