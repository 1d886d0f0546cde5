"""The data an experiment reads, one subpackage per kind, used by the plan and by the ranks.

- `text`: plain text packed into sequences (the bundled corpus, local files, `data=hf`); its file
  listing and held-out split are `files` and `records`, shared with every kind.
- `chat`: conversations rendered by the tokenizer's chat template with a trained mask (`data=chat`).
- `preference`: pairs of a chosen and a rejected answer to one prompt, rendered and masked by chat's
  code (`data=preference`).

`figures` gives the plan's figures of whichever kind a run reads, `sample` and `marks` its first
samples as the ranks read them (`qwen3exp data show`). Nothing here imports torch or torchtitan: the
ranks' dataloaders (`qwen3exp.titan.*dataset`) call this code, so the plan checks what they read.
"""
