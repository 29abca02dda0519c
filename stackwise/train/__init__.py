from stackwise.io.trained import build_rack, load_trained, save_model
from stackwise.train import memory_use  # noqa: F401  (registers the "memory" extension)
from stackwise.train.optim import build_optimizer, build_param_groups, build_scheduler, lr_factor
from stackwise.train.sampler import EpochSampler
from stackwise.train.state import TrainState
from stackwise.train.trainer import Trainer

__all__ = [
    "EpochSampler",
    "TrainState",
    "Trainer",
    "build_optimizer",
    "build_param_groups",
    "build_rack",
    "build_scheduler",
    "load_trained",
    "lr_factor",
    "save_model",
]
