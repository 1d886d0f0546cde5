"""Plain text, documents packed into sequences: the bundled corpus and local files
(`qwen3exp.data.files`), a Hugging Face dataset (`hf_source`, `hf_files`)."""
