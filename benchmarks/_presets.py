"""Overrides the benchmarks share when they turn the default (diffusion) preset into clm."""

# settings only masked racks read, back at their defaults for a clm run of the default preset
CLM_RESETS = [
    "sample.steps=32",
    "sample.sampler=auto",
    "sample.remasking=low_confidence",
    "sample.block_length=0",
    "masking.schedule=linear",
]
