"""The `eval` section: what a run shows of the model besides its loss. `eval.samples` (any option):
a few prompts answered by rank 0 at every validation, into `samples.jsonl` and the trackers.
`eval=lm_eval`: lm-evaluation-harness tasks run on the exported model after training (or later
with `qwen3exp eval RUN`), their scores recorded in summary.json."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from qwen3exp.config.sections.base import PosInt, Strict


class NoEval(Strict):
    """No benchmark after training; samples only when `samples` lists prompts."""

    kind: Literal["none"] = "none"
    samples: list[Annotated[str, Field(min_length=1)]] = []
    """Prompts answered by the model being trained after every validation loss, written to
    samples.jsonl, TensorBoard and W&B (the chat template is applied when the tokenizer has one;
    each must fit training.seq_len once rendered; needs validation, no pp or cp); [] for none."""
    sample_tokens: PosInt = 32
    """New tokens per answer at most (fewer at an end-of-sequence token; the plan shows the cost:
    prompts x tokens per validation)."""
    sample_temperature: Annotated[float, Field(ge=0)] = 0.0
    """0: greedy; above 0: sampling from softmax(logits / temperature), seeded by sample_seed."""
    sample_seed: int = 0
    """The seed of sampled answers (prompt i draws with seed + i): the same weights and seed give
    the same text."""


class LmEval(NoEval):
    """lm-evaluation-harness on the run's exported model once training ends."""

    kind: Literal["lm_eval"] = "lm_eval"  # type: ignore[assignment]
    tasks: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = ["qwen3exp_tiny"]
    """lm-eval task names (the bundled `qwen3exp_tiny`, tasks under include_path, or lm-eval's own
    whose dataset is in the local HF cache)."""
    num_fewshot: Annotated[int, Field(ge=0)] | None = None
    """Few-shot examples per question (null: each task's own default)."""
    limit: PosInt | None = None
    """Questions per task at most (null: all)."""
    include_path: str | None = None
    """A folder of task YAML files of your own (relative to where qwen3exp runs)."""
    batch_size: PosInt = 1
    """Questions per forward pass."""


Eval = Annotated[NoEval | LmEval, Field(discriminator="kind")]
