"""StackWise: train transformer language models stack by stack.

The public API lives here; everything else is an implementation detail.
"""

# Before anything can run a bf16 matmul: on VMs whose AMX kernels trap, oneDNN must be capped
# first (see stackwise.hwprobe). A warm check is a file read.
from stackwise.hwprobe import ensure_bf16_ready

ensure_bf16_ready()

# ruff: noqa: E402

from stackwise.config import Config, load_config, save_config
from stackwise.data import PreparedData, build_data
from stackwise.errors import StackWiseError
from stackwise.generate import sample_texts
from stackwise.io.merge import merge_checkpoint
from stackwise.model import Block, Rack, Stack
from stackwise.model.hf import export_llama
from stackwise.objectives import Objective, Specials, build_objective
from stackwise.pipeline import train_from_config
from stackwise.progressive import (
    ActivationCache,
    LocalLossTrainer,
    ProgressiveRackBuilder,
    ProgressiveTrainer,
    depth_range,
)
from stackwise.quant import add_adapter, merge_adapters, quantize_linears, weight_bytes
from stackwise.strategies import (
    RunResult,
    TrainingStrategy,
    get_training_strategy,
    register_training_strategy,
)
from stackwise.train import Trainer, build_rack, load_trained
from stackwise.train.adapters import ModelAdapter, get_model_adapter, register_model_adapter
from stackwise.train.extensions import Extension, register_extension

__version__ = "0.1.0"

__all__ = [
    "ActivationCache",
    "Block",
    "Config",
    "Extension",
    "LocalLossTrainer",
    "ModelAdapter",
    "Objective",
    "PreparedData",
    "ProgressiveRackBuilder",
    "ProgressiveTrainer",
    "Rack",
    "RunResult",
    "Specials",
    "Stack",
    "StackWiseError",
    "Trainer",
    "TrainingStrategy",
    "__version__",
    "add_adapter",
    "build_data",
    "build_objective",
    "build_rack",
    "depth_range",
    "export_llama",
    "get_model_adapter",
    "get_training_strategy",
    "load_config",
    "load_trained",
    "merge_adapters",
    "merge_checkpoint",
    "quantize_linears",
    "register_extension",
    "register_model_adapter",
    "register_training_strategy",
    "sample_texts",
    "save_config",
    "train_from_config",
    "weight_bytes",
]
