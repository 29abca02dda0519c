from stackwise.train.checkpoint import build_rack, load_trained, save_model
from stackwise.train.optim import build_optimizer, build_param_groups, build_scheduler, lr_factor
from stackwise.train.trainer import EpochSampler, Trainer, TrainState

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
