"""The attention path (issue 39): SDPA's `is_causal=True` with no mask where no document boundary needs
one (data=chat with data.pack=false; data.cross_document_attention=true), the dense block-causal mask
otherwise; the plan's memory term for that mask and its `attention:` line.

- model=native in-process: the causal model's loss equals the mask model's on rows without a
  boundary; on packed rows the mask model's loss is unchanged (each document alone) and the causal
  model's is not (its documents attend to each other);
- the document mask is built once per step from the positions on the device (no host sync);
- the torchtitan config each data setting builds (and that the trainer builds no masks for it);
- the plan: the mask term where the mask exists (its formula), 0 where it does not;
- cross-document attention with model.attention=flex: exit 2 naming the key (the real command line).
model=hf in-process: tests/test_hf_backend.py."""

from __future__ import annotations

import pytest
import torch

from conftest import compose, run_cli
from qwen3exp.config.flavors import FLAVORS
from qwen3exp.config.schema import validate_experiment

SEQ = 48
PACKED = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, *range(38)], [*range(20), *range(28)]])
PLAIN = torch.arange(SEQ).expand(2, SEQ)


def _models():
    """The tiny native model twice, the same weights: the document-mask SDPA and the causal SDPA."""
    from qwen3exp.titan.model import qwen3_model_config  # lazy: imports torchtitan

    torch.manual_seed(0)
    masked = qwen3_model_config(FLAVORS["tiny"], attention="sdpa").build()
    with torch.no_grad():
        for p in masked.parameters():  # large weights: the loss depends strongly on what is attended
            torch.nn.init.normal_(p, std=0.2) if p.dim() > 1 else torch.nn.init.uniform_(p, 0.5, 1.5)
    causal = qwen3_model_config(FLAVORS["tiny"], attention="sdpa", causal=True).build()
    causal.load_state_dict(masked.state_dict())
    return masked.eval(), causal.eval()


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), labels.flatten()).item()


def test_native_causal_path_gives_the_mask_paths_loss_without_boundaries():
    masked, causal = _models()
    g = torch.Generator().manual_seed(1)
    ids, labels = (torch.randint(0, FLAVORS["tiny"].vocab_size, (2, SEQ), generator=g) for _ in range(2))
    with torch.no_grad():
        plain = [
            _loss(masked(ids, positions=PLAIN, attention_masks=masked.get_attention_masks(positions=PLAIN)), labels),
            _loss(causal(ids, positions=PLAIN), labels),
        ]
        assert abs(plain[0] - plain[1]) < 1e-6, plain
        # Packed rows: the mask path's loss is that of each document run alone (unchanged); the
        # causal path lets the documents see each other (data.cross_document_attention=true).
        packed = masked(ids, positions=PACKED, attention_masks=masked.get_attention_masks(positions=PACKED))
        alone = torch.empty_like(packed)
        for row in range(2):
            starts = [*(PACKED[row] == 0).nonzero().flatten().tolist(), SEQ]
            for lo, hi in zip(starts[:-1], starts[1:], strict=False):
                x, pos = ids[row : row + 1, lo:hi], PACKED[row : row + 1, lo:hi]
                alone[row, lo:hi] = causal(x, positions=pos)[0]
        assert abs(_loss(packed, labels) - _loss(alone, labels)) < 1e-6
        across = _loss(causal(ids, positions=PACKED), labels)
        assert abs(across - _loss(packed, labels)) > 1e-3, across


def test_the_document_mask_is_built_on_the_device_once_per_step(monkeypatch):
    """The native document SDPA's model hands every layer one dense mask built from the positions
    without reading anything back to the host (torchtitan's per-document offsets read a maximum and
    loop over nonzero() per row, every step); it is the mask the offsets gave."""
    from torchtitan.models.common.attention import create_varlen_metadata_for_document  # lazy: torchtitan

    from qwen3exp.titan.attention import document_causal_mask

    masked, _ = _models()
    want = document_causal_mask(create_varlen_metadata_for_document(PACKED), 2, SEQ, "cpu")[:, None]

    def host_sync(*args, **kwargs):
        raise AssertionError("a host sync in get_attention_masks")

    for name in ("item", "tolist", "nonzero", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, host_sync)
    got = masked.get_attention_masks(positions=PACKED)
    monkeypatch.undo()
    assert isinstance(got, torch.Tensor) and got.shape == (2, 1, SEQ, SEQ) and torch.equal(got, want)


@pytest.mark.parametrize(
    ("overrides", "causal"),
    [
        ((), False),  # packed pre-training: the document mask, as before
        (("data.cross_document_attention=true",), True),
        (("experiment=tiny_sft",), True),  # one conversation per sequence
        (("experiment=tiny_sft", "data.pack=true"), False),
        (("model=hf",), False),
        (("model=hf", "data.cross_document_attention=true"), True),
        (("model=hf", "experiment=tiny_sft"), True),
    ],
)
def test_each_data_setting_builds_its_attention(overrides, causal, tmp_path):
    from torchtitan.models.common.attention import FlexAttention, VarlenAttention  # lazy: torchtitan

    from qwen3exp.launchers.local import prepare
    from qwen3exp.titan.attention import CausalSDPAttention, DocumentSDPAttention
    from qwen3exp.titan.hf_model import HFQwen3CausalSdpaModel, HFQwen3SdpaModel
    from qwen3exp.titan.job_config import to_torchtitan

    prep = prepare(validate_experiment(compose("platform=cpu", *overrides)))
    model = to_torchtitan(prep.exp, prep.facts, tmp_path).model_spec.model
    if prep.exp.model.backend == "hf":
        assert type(model) is (HFQwen3CausalSdpaModel.Config if causal else HFQwen3SdpaModel.Config)
        return
    inner = [layer.attention.inner_attention for layer in model.layers]
    assert all(isinstance(a, CausalSDPAttention.Config if causal else DocumentSDPAttention.Config) for a in inner)
    # torchtitan's trainer builds attention masks (per-document offsets: a host sync) only for these.
    assert causal != isinstance(inner[0], (FlexAttention.Config, VarlenAttention.Config))


@pytest.mark.parametrize(
    ("overrides", "dense"),
    [
        ((), True),
        (("training.activation_checkpoint=full",), True),
        (("data.cross_document_attention=true",), False),
        (("experiment=tiny_sft",), False),
        (("experiment=tiny_sft", "data.pack=true"), True),
        (("platform=cuda",), False),  # flex: torchtitan's block-sparse BlockMask, no dense mask
    ],
)
def test_the_plan_counts_the_mask_where_it_exists(overrides, dense, tmp_path):
    from qwen3exp.plan.build import make_plan
    from qwen3exp.plan.render import render

    exp = validate_experiment(compose("dry_run=true", *overrides))
    plan = make_plan(exp, tmp_path)
    text = render(plan)
    attention = next(line for line in text.splitlines() if line.startswith("attention:"))
    t, mem = exp.training, plan.memory
    held = plan.arch.n_layers if t.activation_checkpoint == "none" else 1
    compute = {"float32": 4, "bfloat16": 2}[t.mixed_precision_param]
    expected = t.local_batch_size * t.seq_len**2 * (1 + held * compute) if dense else 0
    assert mem.attention_mask == expected
    assert ("  attention mask " in text) == dense
    if dense:
        assert f"block-causal dense mask [{t.local_batch_size}, 1, {t.seq_len}, {t.seq_len}]" in attention
        assert (
            mem.total == mem.parameters + mem.gradients + mem.optimizer + mem.fsdp_buffers + mem.activations + expected
        )
    else:
        assert "flex" in attention if "platform=cuda" in overrides else "is_causal=True, no mask tensor" in attention


def test_cross_document_attention_on_flex_exits_2_naming_the_key(tmp_path):
    r = run_cli(
        "platform=cuda", "model.attention=flex", "data.cross_document_attention=true", "dry_run=true",
        f"hydra.run.dir={tmp_path / 'r'}",
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert "data.cross_document_attention = True" in out and "model.attention=sdpa" in out, out[-3000:]
    r = run_cli(
        "experiment=tiny_sft", "data.cross_document_attention=true", "dry_run=true", f"hydra.run.dir={tmp_path / 's'}"
    )
    assert r.returncode == 2 and "data.cross_document_attention" in r.stdout + r.stderr
