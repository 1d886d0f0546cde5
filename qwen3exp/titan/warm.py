"""What a node's agent imports once before it forks its ranks (`qwen3exp.worker.main.warm`, a platform
with `forked_ranks`: CPU): torchtitan's trainer, and with it torch and torchtitan's model code, which
every rank would otherwise import itself (about 7 s of CPU each)."""

from __future__ import annotations


def import_trainer() -> None:
    import torchtitan.trainer  # noqa: F401  # lazy: after the platform is prepared, as in a rank
