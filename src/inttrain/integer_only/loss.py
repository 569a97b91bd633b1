"""Integer softmax cross-entropy gradient (docs/integer-training.md §6) on torch integer tensors.

The exp2 table is shipped as integers (Q15), identical to :data:`inttrain.micro.loss.EXP2_LUT`.
"""

from __future__ import annotations

import torch

from .ops import IntTensor, shift_left_saturate, shift_round

LOG2E_Q8 = 369
ERR_EXP = -7
T_MIN = -(63 << 8)
EXP2_LUT_SUM = 12085828
# EXP2_LUT[i] = round(2**(i/256) * 2**15), i = 0..255
_EXP2_LUT_VALUES = (
    32768, 32857, 32946, 33035, 33125, 33215, 33305, 33395, 33486, 33576, 33667, 33759, 33850, 33942, 34034, 34126,
    34219, 34312, 34405, 34498, 34591, 34685, 34779, 34874, 34968, 35063, 35158, 35253, 35349, 35445, 35541, 35637,
    35734, 35831, 35928, 36025, 36123, 36221, 36319, 36417, 36516, 36615, 36715, 36814, 36914, 37014, 37114, 37215,
    37316, 37417, 37518, 37620, 37722, 37824, 37927, 38030, 38133, 38236, 38340, 38444, 38548, 38653, 38757, 38863,
    38968, 39074, 39180, 39286, 39392, 39499, 39606, 39714, 39821, 39929, 40037, 40146, 40255, 40364, 40473, 40583,
    40693, 40804, 40914, 41025, 41136, 41248, 41360, 41472, 41584, 41697, 41810, 41923, 42037, 42151, 42265, 42380,
    42495, 42610, 42726, 42841, 42958, 43074, 43191, 43308, 43425, 43543, 43661, 43780, 43898, 44017, 44137, 44256,
    44376, 44497, 44617, 44738, 44859, 44981, 45103, 45225, 45348, 45471, 45594, 45718, 45842, 45966, 46091, 46216,
    46341, 46467, 46593, 46719, 46846, 46973, 47100, 47228, 47356, 47484, 47613, 47742, 47871, 48001, 48131, 48262,
    48393, 48524, 48655, 48787, 48920, 49052, 49185, 49319, 49452, 49586, 49721, 49856, 49991, 50126, 50262, 50399,
    50535, 50672, 50810, 50947, 51085, 51224, 51363, 51502, 51642, 51782, 51922, 52063, 52204, 52346, 52488, 52630,
    52773, 52916, 53059, 53203, 53347, 53492, 53637, 53782, 53928, 54074, 54221, 54368, 54515, 54663, 54811, 54960,
    55109, 55258, 55408, 55558, 55709, 55860, 56012, 56163, 56316, 56468, 56622, 56775, 56929, 57083, 57238, 57393,
    57549, 57705, 57861, 58018, 58176, 58333, 58491, 58650, 58809, 58968, 59128, 59289, 59449, 59611, 59772, 59934,
    60097, 60260, 60423, 60587, 60751, 60916, 61081, 61247, 61413, 61579, 61746, 61914, 62081, 62250, 62419, 62588,
    62757, 62928, 63098, 63269, 63441, 63613, 63785, 63958, 64132, 64306, 64480, 64655, 64830, 65006, 65182, 65359,
)
EXP2_LUT = torch.tensor(_EXP2_LUT_VALUES, dtype=torch.int64)
_LUT_BY_DEVICE: dict[torch.device, torch.Tensor] = {}


def _lut(device: torch.device) -> torch.Tensor:
    t = _LUT_BY_DEVICE.get(device)
    if t is None:
        t = _LUT_BY_DEVICE[device] = EXP2_LUT.to(device)
    return t


def exp2_q15(t_q8: torch.Tensor) -> torch.Tensor:
    """2**(t/256) * 2**15 for integer t <= 0 (Q8): LUT[t & 255] shifted right by -(t >> 8), rne."""
    t = torch.clamp(t_q8.to(torch.int64), min=T_MIN)
    ip = t >> 8
    f = t & 255
    lut = _lut(t.device)[f]
    s = torch.clamp(-ip, max=20)                  # lut < 2**17: shifts >= 18 give 0 anyway
    one = torch.ones_like(s)
    q = lut >> s
    r = lut & ((one << s) - 1)
    half = (one << s) >> 1
    up = (s > 0) & ((r > half) | ((r == half) & ((q & 1) == 1)))
    return q + up.to(torch.int64)


def softmax_q7(logits: IntTensor) -> torch.Tensor:
    """Integer softmax of int8 logits (N, C) at exponent e: probabilities in Q7 (int64)."""
    q = logits.q.to(torch.int64)
    z = q - q.amax(dim=1, keepdim=True)
    zl = z * LOG2E_Q8
    e = int(logits.exp)
    t = shift_round(zl, -e, "rne") if e <= 0 else shift_left_saturate(zl, e, limit=-T_MIN)
    big_e = exp2_q15(t)
    s = big_e.sum(dim=1, keepdim=True)
    return torch.div(big_e * 256 + s, 2 * s, rounding_mode="floor")


def softmax_cross_entropy_grad(logits: IntTensor, labels: torch.Tensor) -> tuple[IntTensor, torch.Tensor]:
    """Error p - onehot(labels) as int8 codes at exponent -7 (summed loss); returns (error, p_q7)."""
    p = softmax_q7(logits)
    labels = labels.to(device=p.device, dtype=torch.int64)
    err = p.clone()
    rows = torch.arange(labels.shape[0], device=p.device)
    err[rows, labels] -= 128
    return IntTensor(torch.clamp(err, -127, 127).to(torch.int8), ERR_EXP), p


def display_loss(logits: IntTensor, labels: torch.Tensor) -> float:
    """Mean float cross-entropy for progress lines only (outside the integer training step)."""
    z = logits.to_float()
    logp = torch.log_softmax(z, dim=1)
    return float(-logp[torch.arange(labels.shape[0]), labels.to(torch.int64)].mean())
