"""The training infrastructure: the EnhancedTrainer and the parts builders make for it."""

from stackwise.io.trained import build_rack
from stackwise.train import memory_use  # noqa: F401  (registers the "memory" extension)
from stackwise.train.adapters import ModelAdapter, RackAdapter
from stackwise.train.builders import build_trainer
from stackwise.train.checkpoint_manager import CheckpointManager
from stackwise.train.extensions import Extension, ExtensionManager
from stackwise.train.metrics import MetricsLogger
from stackwise.train.optim import build_optimizer, build_param_groups, build_scheduler, lr_factor
from stackwise.train.sampler import EpochSampler
from stackwise.train.state import TrainState
from stackwise.train.strategy import TrainingStrategy
from stackwise.train.trainer import EnhancedTrainer, Trainer

__all__ = [
    "CheckpointManager",
    "EnhancedTrainer",
    "EpochSampler",
    "Extension",
    "ExtensionManager",
    "MetricsLogger",
    "ModelAdapter",
    "RackAdapter",
    "TrainState",
    "Trainer",
    "TrainingStrategy",
    "build_optimizer",
    "build_param_groups",
    "build_rack",
    "build_scheduler",
    "build_trainer",
    "lr_factor",
]
