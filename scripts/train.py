"""`stackwise train` as a script, for launchers that take a script's path:

    accelerate launch --num_processes 4 scripts/train.py --config configs/base_small.yaml
    torchrun --nproc_per_node 4 scripts/train.py --config configs/base_small.yaml

Its arguments are `stackwise train`'s (a config, then key=value overrides). Without a GPU,
accelerate starts several CPU processes only when given --multi_gpu.
"""

import sys

from stackwise.cli import run

if __name__ == "__main__":
    run(["train", *sys.argv[1:]])
