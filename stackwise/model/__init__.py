from stackwise.model.layers import Attention, Block, RMSNorm, Stack, SwiGLU
from stackwise.model.rack import Rack, count_parameters

__all__ = ["Attention", "Block", "RMSNorm", "Rack", "Stack", "SwiGLU", "count_parameters"]
