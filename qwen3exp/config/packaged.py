"""Where the packaged config groups lie: imported by the argument reader (`qwen3exp.config.argv`)
and by tab completion (`qwen3exp.completion`, which must not import Hydra), so it imports nothing."""

from pathlib import Path

CONF_DIR = (Path(__file__).parent.parent / "conf").resolve()
"""The packaged config groups: in a wheel, qwen3exp/conf; in the source tree a link to conf/."""
