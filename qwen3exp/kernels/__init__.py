"""Kernels: PyTorch operators with a Neuron (NKI) implementation, and the torchtitan overrides that
put them into the model.

- `rope`, `moe_blockwise`: `torch.library` operators under the `qwen3exp` namespace. Each has a
  PyTorch implementation (CPU, GPU) and a Neuron implementation that calls nkilib through
  `neuron` (only when the Neuron packages import and the tensors live on a Neuron device).
- `nki_rope`, `nki_moe`: torchtitan `@override` factories swapping `CosSinRoPE` and
  `GroupedExperts` for modules that call those operators (`kernels=nki_rope`, `kernels=nki_moe`).
- `overrides`: which overrides an experiment activates (built-in and `kernels.overrides`), the
  checks that run before launch (every override must match a node, no node claimed twice, ...),
  and the `override.imports` entries handed to torchtitan.

Importing this package is free: torch and torchtitan are imported by the submodules that need them.
"""
