from qwen3exp.cli import entry

entry()
