"""Training objectives, one module each (`sft`, `dpo`, `orpo`, `simpo`), found by the class of the
`objective` section (`qwen3exp.objectives.registry`)."""
