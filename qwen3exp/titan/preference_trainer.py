"""Preference objectives in the ranks: torchtitan's Trainer with the reference model's log-probs.

torchtitan 0.3.0's Trainer computes one forward and backward per micro-batch
(`forward_backward_step`: the model's logits, then `loss_fn(pred, labels, global_valid_tokens)`).
A preference loss (`qwen3exp.titan.preference_loss`) plugs in as the trainer's loss component and
the pairs as its dataloader (`qwen3exp.titan.preference_dataset`); what no public seam offers is
the reference's log-probs of the same batch, so this subclass overrides `forward_backward_step`:
for an objective with a reference (DPO) it first runs the same model on the same inputs, without
gradients, as the reference, then hands the rows' summed log-probs to the loss.

By default the reference is the policy's starting weights, held without a second model:
- peft=lora: the base with the adapters switched off: every `lora_b` (zeros at the start, so the
  starting policy is the base) is zeroed for the reference pass and restored after it, exactly
  the base at every step and after a resume, at the cost of a copy of the adapters;
- a full fine-tune: a frozen copy of the trainable weights, taken at the first step (after the
  initial load), sharded like them (FSDP: each rank holds its shard), swapped into the model in
  place for the reference pass (one weight's worth of temporary memory at a time). Chosen over
  precomputed reference log-probs because it needs no extra pass over the data and stays exact for
  any order, epoch and data-parallel layout; the price is one more copy of the weights per rank
  (the plan says which one is used). The copy is not checkpointed: a resumable run
  (checkpoint.save) with a full-fine-tune reference is refused before launch.
Two other sources (`qwen3exp.titan.reference_logps`): objective.reference, a separate frozen model
of its own architecture, sharded like the policy (`qwen3exp.titan.reference_load`); and
objective.reference_logps=precomputed, log-probs a first pass stored in the run directory, read
back by each sample's pair index (no reference held while training; a resume reuses them).
CUDA graphs are off for these runs: the reference pass and the metrics are Python between the
captured calls.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torchtitan.trainer import Trainer

from qwen3exp.config.sections.data import ChatData, PreferenceData
from qwen3exp.objectives.registry import METRICS
from qwen3exp.plan import reference_model as reference_plan
from qwen3exp.plan.auto_layout import attention_path
from qwen3exp.titan import chat_dataset, preference_dataset, reference_load, reference_logps
from qwen3exp.titan.preference_loss import PreferenceLoss, row_logps
from qwen3exp.titan.preference_validator import PreferenceValidator


class PreferenceTrainer(Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        lora: bool = False
        """peft=lora: the reference is the base with the adapters off; else a frozen copy."""
        reference: str = ""
        """objective.reference: the separate model to build (`reference_load.describe`); "": none."""
        precomputed: bool = False
        """objective.reference_logps=precomputed: stored log-probs (`qwen3exp.titan.reference_logps`)."""

    def __init__(self, config: Config):
        super().__init__(config)
        assert isinstance(self.loss_fn, PreferenceLoss)
        ranks = dist.get_world_size() if dist.is_initialized() else 1
        self.loss_fn.steps_and_ranks = self.gradient_accumulation_steps * ranks
        self._copy: list[torch.Tensor] | None = None
        self.stored_logps: dict[str, torch.Tensor] | None = None  # reference_logps=precomputed
        self.reference_model = None  # objective.reference, live: the separate frozen model
        if config.reference and not config.precomputed:
            self.reference_model = reference_load.build(self, config.reference)
        self.metrics_processor.metric_source = self._metrics
        if isinstance(getattr(self, "validator", None), PreferenceValidator):
            self.validator.reference = self._reference_logps

    def _trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for m in self.model_parts for n, p in m.named_parameters() if p.requires_grad]

    @contextmanager
    def _as_reference(self):
        """The model holds the reference's weights inside the block (no gradients)."""
        with torch.no_grad():
            if self.config.lora:
                adapters = [p for n, p in self._trainable() if "lora_b" in n]
                saved = [p.detach().clone() for p in adapters]
                for p in adapters:
                    p.zero_()
                try:
                    yield
                finally:
                    for p, s in zip(adapters, saved, strict=True):
                        p.copy_(s)
                return
            params = [p for _, p in self._trainable()]
            if self._copy is None:  # the first step: the starting weights, after the initial load
                self._copy = [p.detach().clone() for p in params]
            self._swap(params)
            try:
                yield
            finally:
                self._swap(params)

    def _swap(self, params: list[torch.nn.Parameter]) -> None:
        assert self._copy is not None
        for p, c in zip(params, self._copy, strict=True):
            tmp = p.detach().clone()
            p.copy_(c)
            c.copy_(tmp)

    def _reshard(self) -> None:
        """Drop FSDP's all-gathered copies: a module FSDP keeps unsharded after its forward
        (reshard_after_forward false: the root and the last block) would otherwise serve the next
        forward the weights of the other model (its `unshard` is a no-op while unsharded)."""
        for m in self.model_parts:
            for sub in m.modules():
                if isinstance(sub, FSDPModule):
                    sub.reshard()

    def _reference_logps(self, inputs, labels, extra, pairs=None, part=chat_dataset.TRAIN) -> torch.Tensor:
        """The reference's summed log-probs of each row's counted labels (training and validation)."""
        if self.config.reference or self.config.precomputed:  # a separate model, or stored log-probs
            return reference_logps.of_rows(self, inputs, labels, extra, pairs, part)
        return self.adapters_off_logps(inputs, labels, extra)

    def adapters_off_logps(self, inputs, labels, extra) -> torch.Tensor:
        """The policy's starting weights (LoRA: adapters off; else the frozen copy) as the reference."""
        self._reshard()
        with self._as_reference(), self.train_context():
            pred = self.model_parts[0](inputs, **extra)
            out = row_logps(pred, labels)[0].detach()
            del pred
            self._reshard()  # before the policy's weights are swapped back
        return out

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
        assert not self.parallel_dims.pp_enabled, "refused before launch: pipeline parallelism with a pair objective"
        pairs = input_dict.pop("pair", None)  # reference_logps=precomputed: each sample's pair index
        inputs, labels, extra = self.post_dataloading_process(input_dict, labels)
        if self.loss_fn.module.REFERENCE:
            self.loss_fn.reference = self._reference_logps(inputs, labels, extra, pairs)
        return self.fwd_bwd_fn(inputs, labels, global_valid_tokens, extra)

    def _metrics(self) -> dict[str, float]:
        """The pair metrics since the last logged step, summed over the ranks (every rank calls it)."""
        stacked = self.loss_fn.take_metrics().to(self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(stacked)
        pairs = float(stacked[-1])
        return {f"preference/{name}": float(stacked[i]) / max(pairs, 1.0) for i, name in enumerate(METRICS)}


def own_loaders(config, exp, tokenizer_path: str, facts=None):
    """The Trainer.Config with qwen3exp's own loaders for conversations (data=chat) and pairs
    (data=preference: also this module's trainer and the objective's loss); other data unchanged."""
    if isinstance(exp.data, ChatData):
        chat_dataset.use_chat_loaders(config, exp, tokenizer_path)
        return config
    if not isinstance(exp.data, PreferenceData):
        return config
    kept = {f.name: getattr(config, f.name) for f in fields(config) if f.init and f.name not in ("loss", "dataloader")}
    config.training.disable_cuda_graphs = True
    if exp.validation.enable:  # held-out pairs: the objective's loss and reward accuracy
        v = {f.name: getattr(config.validator, f.name) for f in fields(config.validator) if f.name != "dataloader"}
        val_loader = preference_dataset.loader_config(exp, tokenizer_path, validation=True)
        kept["validator"] = PreferenceValidator.Config(**v, dataloader=val_loader)
    return PreferenceTrainer.Config(
        **kept,
        lora=exp.peft.kind == "lora",
        **reference_config(exp, facts),
        loss=PreferenceLoss.Config(objective=exp.objective.model_dump_json()),
        dataloader=preference_dataset.loader_config(exp, tokenizer_path),
    )


def reference_config(exp, facts) -> dict:
    """The trainer's reference fields: a separate model (objective.reference) and stored log-probs."""
    folder = reference_plan.folder(exp)
    out: dict = {"precomputed": reference_plan.precomputed(exp)}
    if folder is not None:
        out["reference"] = reference_load.describe(str(folder), attention_path(exp, facts), facts.force_sum_reductions)
    return out
