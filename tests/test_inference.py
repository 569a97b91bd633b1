"""to_inference: int8 weight codes + run-time int8 inputs reproduce the integer-training forward pass."""

import pytest
import torch
from torch import nn

import inttrain
from inttrain.inference import Int8Conv2d, Int8Linear, to_inference
from inttrain.nn import QLinear

# Same codes and scales as the training forward; only the float summation order differs.
ATOL = 1e-5


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 4, 32), nn.ReLU(),
                         nn.Linear(32, 10))


def test_inference_copy_matches_the_training_forward_and_is_quantized():
    float_model = _cnn()
    model = inttrain.prepare_(_cnn(), "int8").eval()
    inf = to_inference(model)
    assert [type(m) for m in inf if not isinstance(m, (nn.ReLU, nn.Flatten))] == [Int8Conv2d, Int8Linear, Int8Linear]
    assert isinstance(model[3], QLinear)  # the trained model is not changed
    x = torch.randn(16, 1, 8, 8)
    with torch.no_grad():
        y_int, y_inf, y_float = model(x), inf(x), float_model(x)
    assert (y_inf - y_int).abs().max() < ATOL
    assert (y_inf - y_float).abs().max() > 100 * ATOL  # int8 rounding is really in the graph
    assert inf[0].weight_codes.dtype == torch.int8 and inf[0].weight_scale.shape == (4,)


def test_per_tensor_recipe_and_zero_input():
    model = inttrain.prepare_(_cnn(), inttrain.recipes.Int8MixedConfig(per_channel=False)).eval()
    inf = to_inference(model)
    assert not inf[3].per_row and torch.unique(inf[3].weight_scale).numel() == 1
    for x in (torch.randn(3, 1, 8, 8), torch.zeros(3, 1, 8, 8)):
        with torch.no_grad():
            assert (inf(x) - model(x)).abs().max() < ATOL


@pytest.mark.parametrize("recipe", ["unified-int8", "sbm", "wageubn"])
def test_other_recipes_export_their_forward_exactly(recipe):
    """unified-int8's hooks touch only gradients; wageubn's power-of-two scales and 8-bit BN are reproduced."""
    from inttrain.trainer import apply_recipe

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 8))
    apply_recipe(model, recipe)
    model.eval()
    inf = to_inference(model)
    assert isinstance(inf[0], Int8Conv2d) and inf[0].pow2 == (recipe == "wageubn")
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        assert (inf(x) - model(x)).abs().max() < ATOL


def test_operand_transforming_recipes_are_refused_by_name():
    torch.manual_seed(0)
    model = inttrain.prepare_(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)), "dorefa")
    with pytest.raises(ValueError, match=r"^layer 1 \(QLinear\) cannot be exported to int8: its recipe transforms "
                                         r"the operands at run time \(\w+\)$"):
        to_inference(model)


def test_gpt2_conv1d_becomes_int8_linear():
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
    torch.manual_seed(0)
    conv = inttrain.prepare_(pytorch_utils.Conv1D(6, 5), "int8")
    inf = to_inference(conv)
    x = torch.randn(2, 3, 5)
    assert isinstance(inf, Int8Linear) and inf.weight_codes.shape == (6, 5)
    with torch.no_grad():
        assert (inf(x) - conv(x)).abs().max() < ATOL
