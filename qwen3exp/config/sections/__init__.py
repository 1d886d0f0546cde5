"""The experiment's sections, one module per family (model, training, parallelism, kernels,
checkpoint, platform, data, launcher, metrics, sweep) on the shared `base`. Each name is imported
from the module that defines it; `qwen3exp.config.schema` assembles them into the `Experiment`."""
