"""What ``prepare_`` left in float and why: a warning class, per-type reasons and the summary table."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

__all__ = ["FloatFallbackWarning", "ConversionReport", "float_reason"]


class FloatFallbackWarning(UserWarning):
    """A layer with weights stays in float: no integer kernel serves it (the message says why).

    Silence it as any warning: ``warnings.filterwarnings("ignore", category=inttrain.FloatFallbackWarning)``.
    """


_CONV_OTHER = (nn.Conv1d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def float_reason(module: nn.Module) -> str:
    """Why a module that is not a plain Linear / Conv2d / transformers Conv1D stays in float.

    ``"not a GEMM layer"`` for modules without a matrix product of their own (activations, norms,
    containers, embeddings: a lookup, not a GEMM), which are not reported.
    """
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        return f"subclass {type(module).__name__} of {nn.Linear.__name__ if isinstance(module, nn.Linear) else 'Conv2d'}" \
               " (its owner may call the functional op on its weight, not its forward)"
    if isinstance(module, _CONV_OTHER):
        return f"no integer kernel for {type(module).__name__} (integer convolutions: Conv2d only)"
    if isinstance(module, nn.RNNBase):
        return f"{type(module).__name__}: its GEMMs run inside torch's fused recurrent kernel"
    if isinstance(module, nn.MultiheadAttention):
        return "its q/k/v projection is a raw parameter used by F.multi_head_attention_forward (write the" \
               " projections as nn.Linear layers to convert them)"
    if isinstance(module, nn.Bilinear):
        return "no integer kernel for Bilinear"
    return "not a GEMM layer"


@dataclass
class ConversionReport:
    """Converted layers per (float) type, and every layer with weights left in float with its reason."""

    converted: dict[str, int] = field(default_factory=dict)
    left_in_float: list[tuple[str, str, str]] = field(default_factory=list)  # (name, type, reason)

    @property
    def num_converted(self) -> int:
        return sum(self.converted.values())

    def table(self) -> str:
        """One row per layer type: converted, left in float; then the float layers with their reasons."""
        floats: dict[str, int] = {}
        for _, kind, _ in self.left_in_float:
            floats[kind] = floats.get(kind, 0) + 1
        kinds = list(dict.fromkeys([*self.converted, *floats]))
        width = max([len("layer type"), *map(len, kinds)])
        lines = [f"{'layer type':<{width}}  integer  float"]
        lines += [f"{k:<{width}}  {self.converted.get(k, 0):>7}  {floats.get(k, 0):>5}" for k in kinds]
        lines.append(f"{'total':<{width}}  {self.num_converted:>7}  {len(self.left_in_float):>5}")
        lines += [f"  float: {name} ({kind}): {reason}" for name, kind, reason in self.left_in_float]
        return "\n".join(lines)
