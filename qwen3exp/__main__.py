from qwen3exp.entry import entry

entry()
