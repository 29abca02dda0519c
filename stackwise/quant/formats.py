"""Weight storage formats no library serves on the CPU: fp8 (e4m3) and NVFP4 (e2m1 + scales).

Both are storage formats: weights are kept compressed and dequantized to the compute dtype in
forward. NF4 comes from bitsandbytes instead (see `stackwise.quant.layers`).

fp8:   one float8_e4m3fn per weight, one fp32 scale per output row (amax / 448).
nvfp4: one 4-bit e2m1 code per weight (sign + 3 bits, values 0, .5, 1, 1.5, 2, 3, 4, 6), two
       codes per byte; one float8_e4m3fn scale per block of 16 weights along the input dim; one
       fp32 scale per tensor, chosen so that block scales use e4m3's range (amax / (6 * 448)).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_MAX = 6.0
NVFP4_BLOCK = 16


# -- fp8 ----------------------------------------------------------------------------------------


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) weight -> (float8_e4m3fn codes, fp32 per-row scales)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1).clamp(min=1e-12)
    scale = amax / FP8_MAX
    codes = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def dequantize_fp8(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (codes.float() * scale[:, None]).to(dtype)


# -- nvfp4 --------------------------------------------------------------------------------------


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (0..15, bit 3 = sign) for values already scaled into [-6, 6]."""
    values = E2M1_VALUES.to(x.device)
    mag = x.abs().clamp(max=E2M1_MAX)
    idx = (mag[..., None] - values).abs().argmin(dim=-1)
    sign = (x < 0) & (idx > 0)
    return (idx | (sign.to(idx.dtype) << 3)).to(torch.uint8)


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    values = E2M1_VALUES.to(codes.device)
    mag = values[(codes & 7).long()]
    return torch.where((codes & 8) > 0, -mag, mag)


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, in) weight -> (packed uint8 (out, in'/2), fp8 block scales (out, in'/16), fp32
    tensor scale ()), where in' is `in` rounded up to whole blocks (zero padded)."""
    w = w.detach().float()
    pad = -w.shape[1] % NVFP4_BLOCK
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    out_f, in_f = w.shape
    blocks = w.view(out_f, in_f // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = blocks.abs().amax(dim=-1)
    tensor_scale = (block_amax.max() / (E2M1_MAX * FP8_MAX)).clamp(min=1e-12)
    block_scale = (block_amax / E2M1_MAX / tensor_scale).clamp(max=FP8_MAX)
    block_scale = block_scale.to(torch.float8_e4m3fn)
    eff = block_scale.float() * tensor_scale
    scaled = blocks / torch.where(eff > 0, eff, torch.ones_like(eff))[..., None]
    codes = _e2m1_codes(scaled).view(out_f, in_f)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, block_scale, tensor_scale


def dequantize_nvfp4(
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    tensor_scale: torch.Tensor,
    dtype: torch.dtype,
    in_features: int | None = None,
) -> torch.Tensor:
    out_f = packed.shape[0]
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).view(out_f, -1)
    values = _e2m1_values(codes).view(out_f, -1, NVFP4_BLOCK)
    w = (values * (block_scale.float() * tensor_scale)[..., None]).view(out_f, -1)
    return w[:, :in_features].to(dtype)
