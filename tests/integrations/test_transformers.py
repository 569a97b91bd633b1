"""IntTrainCallback in a real transformers.Trainer: tiny GPT-2 and Llama built from configs (no downloads)."""

import json

import pytest
import torch
from torch.utils.data import Dataset

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

import inttrain  # noqa: E402
from inttrain.integrations.transformers import STATE_FILE, IntTrainCallback  # noqa: E402
from inttrain.recipes import Int8MixedConfig  # noqa: E402
from inttrain.spec import Rounding  # noqa: E402

VOCAB, SEQ = 32, 16
RECIPE = Int8MixedConfig(grad_rounding=Rounding.STOCHASTIC)  # resume is exact only with the counters restored


class Counting(Dataset):
    """Sequences that count up modulo VOCAB from a random start: the next token is always predictable."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        starts = torch.randint(0, VOCAB, (n, 1), generator=g)
        self.ids = (starts + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=None, eos_token_id=None))


def _llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ))


def _args(out, steps: int, **kw) -> TrainingArguments:
    kw = {"save_strategy": "no", **kw}
    return TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-2,
                             logging_steps=5, report_to=[], use_cpu=True, seed=0, disable_tqdm=True, **kw)


@pytest.mark.parametrize("build, converted", [(_gpt2, {"Conv1D": 8, "Linear": 1}), (_llama, {"Linear": 15})])
def test_trainer_trains_converted_model(tmp_path, build, converted):
    model, cb = build(), IntTrainCallback("int8")
    trainer = Trainer(model=model, args=_args(tmp_path, 40), train_dataset=Counting(), callbacks=[cb])
    assert inttrain.conversion_report(model).converted == converted  # converted when the Trainer is built
    assert cb.report.left_in_float == []
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < 0.5 * losses[0]
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert all(r["inttrain/integer_layers"] == sum(converted.values()) and r["inttrain/float_layers"] == 0 for r in rows)
    # 5 steps per row; every converted layer runs forward, input-grad and weight-grad GEMMs each step
    # (input grad everywhere: embeddings feed the first layers, so all activations require grad)
    assert all(r["inttrain/int8_mm"] == 5 * 3 * sum(converted.values()) for r in rows)


def test_gpt2_conv1d_saves_and_reloads_as_plain_transformers(tmp_path):
    model = _gpt2()
    Trainer(model=model, args=_args(tmp_path, 2), train_dataset=Counting(), callbacks=[IntTrainCallback("int8")]).train()
    assert type(model.transformer.h[0].attn.c_attn).__name__ == "QConv1D"
    model.save_pretrained(tmp_path / "saved")
    back = GPT2LMHeadModel.from_pretrained(tmp_path / "saved")
    assert type(back.transformer.h[0].attn.c_attn) is Conv1D
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k


def test_resume_from_checkpoint_is_bit_identical(tmp_path):
    const = {"lr_scheduler_type": "constant"}  # the 6-step first leg must not decay the lr to 0 at its end
    full = _gpt2()
    Trainer(model=full, args=_args(tmp_path / "full", 12, **const), train_dataset=Counting(),
            callbacks=[IntTrainCallback(RECIPE)]).train()

    first = _gpt2()
    Trainer(model=first, args=_args(tmp_path / "run", 6, save_strategy="steps", save_steps=6, **const), train_dataset=Counting(),
            callbacks=[IntTrainCallback(RECIPE)]).train()
    saved = json.loads((tmp_path / "run" / "checkpoint-6" / STATE_FILE).read_text())
    assert saved["recipe"] == "int8" and set(saved["layer_calls"].values()) == {6}

    resumed = _gpt2()
    Trainer(model=resumed, args=_args(tmp_path / "run", 12, **const), train_dataset=Counting(),
            callbacks=[IntTrainCallback(RECIPE)]).train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-6"))
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k


def test_trained_llama_exports_to_onnx_with_int8_qdq(tmp_path):
    """Trained in transformers.Trainer, deployed with ONNX Runtime: the same next-token predictions."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from inttrain.inference import export_onnx, to_inference

    model = _llama()
    Trainer(model=model, args=_args(tmp_path, 10), train_dataset=Counting(), callbacks=[IntTrainCallback("int8")]).train()
    model.eval()

    class Logits(torch.nn.Module):  # token ids in, logits out: one tensor each way
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    ids = Counting(8).ids
    run = export_onnx(Logits(to_inference(model)), ids[:2], tmp_path / "llama.onnx")
    with torch.no_grad():
        trained = Logits(model)(ids)
    exported = run(ids)  # batch 8 through a graph exported at batch 2
    assert torch.equal(exported.argmax(-1), trained.argmax(-1))
    assert (exported - trained).abs().max() < 1e-4
