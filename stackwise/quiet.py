"""Library messages on stderr that a user can do nothing about, filtered by their exact text.

Only these: DeepSpeed's note that it picked the CPU (the run's header says the device) and
torch's deprecation of the collective names DeepSpeed calls (a warning per call);
bitsandbytes' note that the optional `kernels` package is missing (it falls back to its own
CPU kernel), torch's note that our optimizer state was pickled with protocol 4 (it is read
with weights_only=True either way), transformers' deprecation of an attribute that PEFT (not
we) reads, and bitsandbytes' int8 note that it casts inputs to fp16, printed at every matmul.
Every other warning, from these libraries too, still reaches the user.
"""

from __future__ import annotations

import logging
import os
import warnings

BNB_LOGGER = "bitsandbytes.backends.cpu.ops"
BNB_KERNELS = "Failed to load CPU gemm_4bit_forward from kernels-community"
TORCH_PICKLE = r"Detected pickle protocol \d+ in the checkpoint"
PEFT_DEPRECATION = r"`is_gradient_checkpointing` is deprecated"
BNB_INT8_CAST = r"MatMul8bitLt: inputs will be cast from"  # once per matmul: thousands of lines
# DeepSpeed's collectives call torch's deprecated names, a warning per call
DS_COLLECTIVES = (
    r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
)


class _DropKernelsNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(BNB_KERNELS)


def filter_library_noise() -> None:
    """Idempotent; install before bitsandbytes is imported (its note comes at import)."""
    logger = logging.getLogger(BNB_LOGGER)
    if not any(isinstance(f, _DropKernelsNote) for f in logger.filters):
        logger.addFilter(_DropKernelsNote())
    warnings.filterwarnings("ignore", message=TORCH_PICKLE, category=UserWarning)
    warnings.filterwarnings("ignore", message=PEFT_DEPRECATION, category=FutureWarning)
    warnings.filterwarnings("ignore", message=BNB_INT8_CAST)
    warnings.filterwarnings("ignore", message=DS_COLLECTIVES, category=FutureWarning)


def quiet_deepspeed_on_cpu() -> None:
    """DeepSpeed, once installed, is imported by Accelerate too, and warns that it picked the
    CPU when it finds no GPU: told so, it does not. Call where the run's device is the CPU."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def quiet_deepspeed_without_gpu() -> None:
    """quiet_deepspeed_on_cpu where torch finds no CUDA GPU (the CPU is then the device)."""
    import torch

    if not torch.cuda.is_available():
        quiet_deepspeed_on_cpu()
