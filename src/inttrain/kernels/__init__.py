"""Integer kernels: exact references (test oracles) and fast paths, chosen once per device.

- :mod:`.matmul`: int8/int16 GEMMs on ``torch._int_mm`` (oneDNN's AVX512-VNNI GEMM on x86 CPUs, cuBLASLt on
  CUDA), on AMX tiles (:mod:`.native`, ``gemm_amx.c``) where the CPU has AMX-INT8, or on AVX2 integer
  instructions (``gemm_avx2.c``) where it has no int8 dot-product instruction.
- :mod:`.conv`: int8 convolution forward / input-gradient / weight-gradient (native VNNI or AMX kernels on CPU,
  oneDNN int8 conv + GEMMs where they cannot run),
  :mod:`.conv_wide` (9..16-bit codes as int8 halves on those kernels), :mod:`.conv_generic` (im2col + GEMM, any
  device) and :mod:`.conv_reference` (the exact oracle).
- :mod:`.fused`: the quantize and dequantize passes around them, fused with ``torch.compile``.
"""

from __future__ import annotations

from .counters import int_kernel_calls, reset_kernel_calls
from .matmul import INT8_SAFE_K, has_int_mm, int8_mm, int_mm, int_mm_reference, split_int16
from . import ops  # noqa: F401  (registers the inttrain:: operators that compiled graphs call)

__all__ = [
    "INT8_SAFE_K", "has_int_mm", "int8_mm", "int_mm", "int_mm_reference", "split_int16",
    "int_kernel_calls", "reset_kernel_calls", "describe",
]


def describe() -> dict[str, str]:
    """Which kernel path serves each operation on this machine (for ``inttrain env``)."""
    import torch

    from .fused import compile_enabled

    from . import native

    if native.amx_available():
        cpu_int = "native AMX int8 GEMM (kernels/native/gemm_amx.c)"
    elif native.avx2_gemm_preferred():
        cpu_int = ("native AVX2 int8 GEMM (kernels/native/gemm_avx2.c: vpmaddwd on int16-extended codes; no int8 "
                   "dot-product instruction here, where torch._int_mm runs a reference loop)")
    else:
        cpu_int = "torch._int_mm (oneDNN int8 GEMM)" if has_int_mm("cpu") else "int64 reference (slow, exact)"
    amx_conv, amx_wgrad = "", ""
    if native.conv_kernel("forward", 16, (1, 1), (1, 1)) == "amx":
        amx_conv = "AMX implicit GEMM at stride 1 (kernels/native/conv_amx.c), else "
    if native.conv_kernel("weight_grad", 16, (1, 1), (1, 1)) == "amx":
        amx_wgrad = "AMX tiles at stride 1 with in-channels a multiple of 16 (kernels/native/conv.c), else "
    from .conv import onednn_int8_conv_exact

    conv_fwd = (amx_conv + "native AVX512-VNNI implicit GEMM (kernels/native/conv.c; uint8 activations, zero point "
                "128), else " if native.available() else "")
    avx2 = native.avx2_conv_preferred(1)
    if avx2:
        conv_fwd += "native AVX2 implicit GEMM (kernels/native/conv_avx2.c: int16 codes, vpmaddwd), grouped: "
    conv_fwd += ("oneDNN int8 convolution" if onednn_int8_conv_exact() else
                 "im2col + the int8 GEMM above (oneDNN's int8 convolution saturates int16 pairs on this CPU)")
    conv_wgrad = amx_wgrad + ("native AVX512-VNNI kernel (kernels/native/conv.c), else " if native.available() else "")
    if avx2:
        conv_wgrad += "native AVX2 kernel (kernels/native/conv_avx2.c: pixel pairs in int16), grouped: "
    conv_wgrad += "the int8 GEMM above: shifted GEMMs (<= 16 in-channels) or im2col per batch chunk"
    info = {
        "linear (cpu)": cpu_int,
        "conv2d forward/input grad (cpu)": conv_fwd,
        "conv2d weight grad (cpu)": conv_wgrad,
        "quantize/epilogue fusion": "torch.compile" if compile_enabled() else "eager (INTTRAIN_COMPILE=0)",
        "dataflow batch-norm backward (cpu)": ("native (kernels/native/batch_norm.c)" if native.batch_norm_available()
                                               else "the compiled pass (kernels/dataflow_passes.py)"),
        "cpu capability": str(torch.backends.cpu.get_cpu_capability()),
    }
    if torch.cuda.is_available():
        info["linear (cuda)"] = "torch._int_mm (cuBLASLt int8, zero-padded to its shape rules)"
        info["conv2d (cuda)"] = "im2col + torch._int_mm (exact, device-generic path)"
    return info
