"""The `data` section (bundled corpus or local files) and the `validation` section (the held-out loss)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from qwen3exp.assets import ASSETS
from qwen3exp.config.sections.base import PosInt, Strict, tagged


class PackedText(Strict):
    """What the plain-text sources share: documents packed into sequences."""

    cross_document_attention: bool = False
    """false: each token attends only to the earlier tokens of its own document (a dense block-causal
    mask on the SDPA path, torchtitan's document BlockMask on flex). true: plain causal attention over
    the whole sequence, across the packed documents (what the Trainium walkthrough's SDPA does:
    `is_causal=True`, no mask tensor, torch's causal kernel); positions still restart at each
    document. model.attention=auto then takes SDPA on every platform; model.attention=flex is refused."""

    @property
    def causal_attention(self) -> bool:
        """No document boundary needs a mask (`qwen3exp.plan.attention_path`)."""
        return self.cross_document_attention


class BundledData(PackedText):
    source: Literal["bundled"] = "bundled"
    """The small corpus shipped with qwen3exp (CPython standard-library docstrings)."""
    eos: str | None = None
    """The token that ends each document (the separator between packed documents). null: the model's
    end-of-text token (`<|endoftext|>` when the tokenizer has it, else its eos_token)."""


class LocalData(PackedText):
    source: Literal["local"] = "local"
    path: str
    """A .jsonl file (one {"text": ...} per line), a .txt file (one document per blank-line
    separated paragraph), or a folder of such files."""
    text_field: str = "text"
    """The field of each JSON record that holds its text."""
    eos: str | None = None
    """The token that ends each document (the separator between packed documents). null: the model's
    end-of-text token (`<|endoftext|>` when the tokenizer has it, else its eos_token)."""


class DatasetFiles(Strict):
    """Where a Hugging Face dataset's files are (data=hf, data=preference): by name in the local
    Hugging Face cache or local files, resolved by `qwen3exp.data.text.hf_source`."""

    name: str | None = None
    """A dataset repo id in the local Hugging Face cache (HF_HUB_CACHE or HF_HOME): `org/name`, or
    `org/name@revision`; nothing is downloaded (`hf download org/name --repo-type dataset` fetches it)."""
    files: str | None = None
    """Local data files: a parquet, .jsonl/.json, .arrow or .csv file, a folder of them, or a glob."""
    split: str = "train"
    """The split to train on (a dataset folder's split files, or its README's `configs`)."""
    subset: str | None = None
    """The subset (a `config_name` of the dataset's README); null: its default."""


class HFData(PackedText, DatasetFiles):
    """A Hugging Face dataset read as plain text: by name from the local Hugging Face cache, or
    local files (parquet, jsonl/json, arrow, csv). Exactly one of `name` and `files`."""

    source: Literal["hf"] = "hf"
    text_field: str = "text"
    """The column that holds each document's text."""
    streaming: bool = False
    """Read the files as a stream (no arrow copy in the datasets cache first)."""
    eos: str | None = None
    """The token that ends each document (the separator between packed documents). null: the model's
    end-of-text token (`<|endoftext|>` when the tokenizer has it, else its eos_token)."""

    @model_validator(mode="after")
    def _one_source(self) -> HFData:
        if (self.name is None) == (self.files is None):
            given = "both are given" if self.name is not None else "neither is given"
            raise ValueError(
                tagged(
                    "name" if self.name is not None else "files",
                    self.name,
                    f"data=hf reads a dataset by name or local files, and {given}",
                    "exactly one of data.name (org/name[@revision]) and data.files (a path or glob)",
                )
            )
        return self


class ChatData(Strict):
    """Supervised fine-tuning on conversations: each one rendered by the tokenizer's chat template,
    the loss on the tokens `loss_on` names, one conversation per sequence or several (`pack`); padding
    is never trained."""

    source: Literal["chat"] = "chat"
    path: str | None = None
    """A .jsonl file, or a folder of them: one conversation per line, {"messages": [{"role",
    "content"}, ...], "tools": [...]} (roles system, user, assistant, tool; an assistant turn may add
    "reasoning_content" and "tool_calls"; "tools" optional) or {"prompt", "completion"}. Every field
    goes to the chat template, and one it does not render is refused, as is any other field. null:
    the small synthetic conversation set shipped with qwen3exp (qwen3exp/assets/chat)."""
    messages_field: str = "messages"
    """The field that holds each record's list of messages."""
    loss_on: Literal["assistant", "last_assistant", "all"] = "assistant"
    """assistant: every assistant turn as the model writes it (its reasoning, content and tool calls)
    and its end-of-turn token; last_assistant: the last assistant turn's only; all: every token of the
    conversation (tools, tool results and user turns too)."""
    max_len_policy: Literal["drop", "truncate"] = "drop"
    """A conversation longer than training.seq_len + 1 tokens: dropped, or cut to that length."""
    pack: bool = False
    """true: several whole conversations per sequence, packed greedily in order (one that does not fit
    in what is left starts the next sequence), each with its own positions from 0 and a document mask,
    so no token attends across a conversation boundary; the tail of a sequence is padded and untrained.
    false: one conversation per sequence, padded."""

    @property
    def causal_attention(self) -> bool:
        """One conversation per sequence: no document boundary needs a mask (`qwen3exp.plan.attention_path`)."""
        return not self.pack

    @property
    def location(self) -> str:
        """data.path, or the folder of the bundled conversations."""
        return self.path if self.path is not None else str(ASSETS / "chat")


class PreferenceData(DatasetFiles):
    """Preference pairs for objective=dpo, orpo or simpo: each record a prompt with a chosen and a
    rejected answer, both rendered by the tokenizer's chat template as chat SFT renders a
    conversation (`qwen3exp.data.chat.render`), a completion's log-prob taken over the final
    assistant turn's trained tokens (its content and end-of-turn token). Each side is one sequence,
    padded; a batch holds the chosen and the rejected side of each pair next to each other, so
    training.local_batch_size counts sequences (two per pair) and must be even."""

    source: Literal["preference"] = "preference"
    path: str | None = None
    """A .jsonl file, or a folder of them: one pair per line, {"prompt", "chosen", "rejected"}
    (prompt a string or a list of messages: system, user, earlier assistant turns; chosen and
    rejected a string or a list of one assistant message), or {"chosen", "rejected"} as whole
    conversations sharing their prompt (the implicit-prompt format). null (and no data.name or
    data.files): the pairs shipped with qwen3exp (qwen3exp/assets/preference), built from the bundled
    conversations. A dataset's files (data.name, data.files) hold the same records as columns
    prompt (optional), chosen and rejected; its other columns are not read (the plan names them)."""
    max_len_policy: Literal["drop", "truncate"] = "drop"
    """A side longer than training.seq_len + 1 tokens: the pair is dropped, or that side cut to that length."""

    @model_validator(mode="after")
    def _one_source(self) -> PreferenceData:
        given = [k for k in ("path", "name", "files") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(
                tagged(
                    given[1],
                    getattr(self, given[1]),
                    f"data=preference reads one source of records, and {' and '.join(given)} are given",
                    "one of data.path (JSON lines), data.name (a cached dataset) and data.files; "
                    "none: the bundled pairs",
                )
            )
        if self.name is None and self.files is None:
            for key in ("split", "subset"):
                default = DatasetFiles.model_fields[key].default
                if getattr(self, key) != default:
                    raise ValueError(
                        tagged(
                            key,
                            getattr(self, key),
                            "chooses a dataset's files, and neither data.name nor data.files is given",
                            repr(default) if default else "null",
                        )
                    )
        return self

    @property
    def causal_attention(self) -> bool:
        """One sequence per side: no document boundary needs a mask (`qwen3exp.plan.attention_path`)."""
        return True

    @property
    def location(self) -> str:
        """What the records are read from: data.path, data.files, data.name, or the folder of the bundled pairs."""
        given = self.path or self.files or self.name
        return given if given is not None else str(ASSETS / "preference")


Kind = Annotated[BundledData | LocalData | HFData | ChatData | PreferenceData, Field(discriminator="source")]
"""One data kind: what a run reads alone, or one source of a mixture (`qwen3exp.config.sections.mixture`)."""


class Validation(Strict):
    """A held-out loss, measured by torchtitan's validator on documents no training step reads."""

    enable: bool = True
    """Measure a held-out loss with torchtitan's validator."""
    freq: PosInt = 10
    """Validate at step 1, every `freq` steps and at the last step."""
    steps: PosInt = 2
    """Batches per validation (local_batch_size x seq_len tokens per data-parallel rank each)."""
    fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    """Without `path`: the share of the training documents held out, the same ones every run
    (ranked by a fixed hash of their position); training never reads them."""
    path: str | None = None
    """A separate validation file or folder (the formats of data.path); training then reads all of
    its own documents."""

    @property
    def held_out(self) -> float | None:
        """The fraction of the training data held out (None: a separate path, or no validation)."""
        return self.fraction if self.enable and self.path is None else None
