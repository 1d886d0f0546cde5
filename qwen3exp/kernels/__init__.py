"""Kernels: PyTorch operators with a Neuron (NKI) implementation, and the kernel overrides that put
them into the model.

- `rope`, `moe_blockwise`: `torch.library` operators under the `qwen3exp` namespace. Each has a
  PyTorch implementation (CPU, GPU) and a Neuron implementation that calls nkilib through
  `neuron` (only when the Neuron packages import and the tensors live on a Neuron device).
- `nki_rope`, `nki_moe`: one module per kernel override (`kernels=nki_rope`, `kernels=nki_moe`):
  the section field that activates it, its factory, the nodes it claims, the keyword arguments and
  the checks it needs before launch. Their torchtitan `@override` factories, which swap
  `CosSinRoPE` and `GroupedExperts` for modules that call the operators above, are
  `qwen3exp.titan.nki_rope` and `qwen3exp.titan.nki_moe` (only qwen3exp.titan imports torchtitan).
- `registry`: which overrides an experiment activates (built-in and `kernels.overrides`), found by
  the section field's class, and their pre-launch problems; `qwen3exp.titan.overrides` matches them
  against the config tree and hands them to torchtitan.

Importing this package is free: torch is imported by the operator modules only.
"""
