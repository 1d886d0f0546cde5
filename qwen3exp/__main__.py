import sys

from qwen3exp.cli import main

sys.exit(main())
