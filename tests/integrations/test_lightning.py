"""IntTrainCallback in a real Lightning Trainer: converts, trains, logs, and resumes bit-identically."""

import csv

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from inttrain.integrations.lightning import IntTrainCallback  # noqa: E402
from inttrain.nn import QLinear  # noqa: E402
from inttrain.recipes import Int8MixedConfig  # noqa: E402
from inttrain.spec import Rounding  # noqa: E402

# Stochastic rounding of gradients: resume is bit-identical only if the layers' call counters come back too.
RECIPE = Int8MixedConfig(grad_rounding=Rounding.STOCHASTIC)


class Lit(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=False)


def _trainer(tmp_path, epochs: int, **kw) -> "L.Trainer":
    return L.Trainer(max_epochs=epochs, accelerator="cpu", logger=CSVLogger(tmp_path, name="lit"),
                     enable_progress_bar=False, enable_model_summary=False, deterministic=True, **kw)


def test_callback_converts_trains_and_logs(tmp_path):
    lit, cb = Lit(), IntTrainCallback(RECIPE)
    trainer = _trainer(tmp_path, 3, callbacks=[cb], enable_checkpointing=False)
    trainer.fit(lit, _data())
    assert isinstance(lit.net[0], QLinear) and isinstance(lit.net[2], QLinear)
    assert sum(lit.losses[-8:]) < 0.6 * sum(lit.losses[:8])  # the last epoch's loss is well below the first's
    # 8 batches x 2 layers: forward + weight grad each, input grad for the second layer only -> 40 int8 GEMMs
    assert cb.last_epoch_kernel_calls == {"inttrain/int8_mm": 40.0, "inttrain/integer_kernel_calls": 40.0}
    log_dir = trainer.logger.log_dir
    hparams = (tmp_path / "lit" / "version_0" / "hparams.yaml").read_text()
    assert "inttrain/recipe: int8" in hparams and "inttrain/integer_layers: 2" in hparams
    rows = list(csv.DictReader(open(f"{log_dir}/metrics.csv")))
    assert [r["inttrain/int8_mm"] for r in rows if r.get("inttrain/int8_mm")] == ["40.0"] * 3


def test_checkpoint_resume_is_bit_identical(tmp_path):
    full = Lit()
    _trainer(tmp_path / "full", 2, callbacks=[IntTrainCallback(RECIPE)], enable_checkpointing=False).fit(full, _data())

    first = Lit()
    t1 = _trainer(tmp_path / "a", 1, callbacks=[IntTrainCallback(RECIPE)])
    t1.fit(first, _data())
    ckpt = t1.checkpoint_callback.best_model_path
    saved = torch.load(ckpt, weights_only=False)["callbacks"]
    assert saved["IntTrainCallback"]["layer_calls"] == {"net.0": 8, "net.2": 8}
    resumed = Lit()
    _trainer(tmp_path / "b", 2, callbacks=[IntTrainCallback(RECIPE)]).fit(resumed, _data(), ckpt_path=ckpt)
    assert resumed.losses == full.losses[8:]
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_resume_under_another_recipe_is_refused(tmp_path):
    t1 = _trainer(tmp_path / "a", 1, callbacks=[IntTrainCallback("int8")])
    t1.fit(Lit(), _data())
    with pytest.raises(ValueError, match="trained with recipe 'int8', this callback runs 'unified-int8'"):
        _trainer(tmp_path / "b", 2, callbacks=[IntTrainCallback("unified-int8")]).fit(
            Lit(), _data(), ckpt_path=t1.checkpoint_callback.best_model_path)


def test_bf16_points_to_lightning_precision():
    with pytest.raises(ValueError, match="precision='bf16-mixed'"):
        IntTrainCallback("bf16")
