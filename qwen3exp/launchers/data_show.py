"""`qwen3exp data show [overrides] [-n N]`: the first samples of an experiment's training data, as
the ranks would read them, with the tokens the loss trains marked.

The experiment is composed, validated and planned exactly as a launch plans it (`config.precheck`,
then `points.check_job`: the model's files, the data's checks, the platform, the mesh), as a dry
run (`dry_run=true` is added: nothing starts, no device is probed, no run directory is made). A
mistake exits 2 with the launch's message. The samples: `qwen3exp.data.sample`, marked by
`qwen3exp.data.marks`.
"""

from __future__ import annotations

import sys

from qwen3exp.config.argv import parse_argv
from qwen3exp.config.composer import Composer
from qwen3exp.config.precheck import precheck
from qwen3exp.config.sections.data import ChatData
from qwen3exp.data.chat.render import BadRecord
from qwen3exp.data.marks import show_lines
from qwen3exp.data.mixture_sample import first_samples
from qwen3exp.data.sample import Samples
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError, Problem, printable
from qwen3exp.launchers.points import HydraFiles, Point, check_job
from qwen3exp.run.console import colour_allowed

USAGE = """usage: qwen3exp data show [overrides] [-n N | --count N] [-cd DIR]

Compose, check and plan the experiment of OVERRIDES as a launch does (nothing starts) and print the
first N (default 1) samples of its training data as the ranks would read them, the tokens the loss
trains marked: data=chat, each conversation rendered by the tokenizer's chat template; plain text,
each document followed by its separator (data.eos).
  e.g. qwen3exp data show experiment=tiny_sft data.loss_on=last_assistant -n 3"""
_COUNT_ALLOWED = "a whole number from 1 to 1000: -n 3, --count 3, --count=3"


def main(argv: list[str]) -> int:
    """`qwen3exp data ARGV`; the exit code (0 shown, 2 a mistake)."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if argv[:1] != ["show"]:
        what = f"unknown command 'data {printable(argv[0], 100)}'" if argv else "'data' needs a command"
        print(f"qwen3exp: {what}\n{USAGE}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        count, rest, want_help = own_flags(argv[1:])
        if want_help:
            print(USAGE)
            return 0
        point = checked(rest)
        samples = _samples(point, count)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    colour = colour_allowed(sys.stdout)
    t, folder = point.exp.training, point.plan.files.folder
    print(f"qwen3exp data show: {point.exp.name}   (nothing was started)")
    print(printable(f"{samples.source}; seq_len {t.seq_len}; tokenizer {folder}"))
    print("\n".join(show_lines(samples, colour)))
    return 0


def _samples(point: Point, count: int) -> Samples:
    """The first `count` samples; ConfigError for a bad record beyond those the checks read."""
    try:
        return first_samples(point.exp, point.plan.files.folder, count)
    except BadRecord as e:
        where = point.exp.data.location if isinstance(point.exp.data, ChatData) else None
        raise ConfigError([Problem(e.config_key or "data.path", where, f"{e.key} {e.message}")]) from None


def own_flags(argv: list[str]) -> tuple[int, list[str], bool]:
    """(-n/--count, the other words in their order, -h/--help given); ConfigError for a bad count."""
    count, rest, want_help, i = 1, [], False, 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if arg in ("-h", "--help"):
            want_help = True
        elif flag in ("-n", "--count"):
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            count = _count(arg if eq else f"{flag} {value}", value)
        else:
            rest.append(arg)
        i += 1
    return count, rest, want_help


def _count(arg: str, value: str) -> int:
    if value.isdigit() and 1 <= int(value) <= 1000:
        return int(value)
    raise ConfigError([Problem("(command line)", arg.strip(), "is not a number of samples", _COUNT_ALLOWED)])


def checked(argv: list[str]) -> Point:
    """The experiment of a launch's command line `argv`, composed, validated and planned as a dry
    run; ConfigError naming every problem, as a launch names them."""
    inv = parse_argv(argv)
    if inv.multirun or inv.info_flags:
        given = " ".join(["-m"] if inv.multirun else inv.info_flags)
        raise ConfigError(
            [
                Problem(
                    "(command line)",
                    given,
                    "is not for data show, which shows one experiment's data",
                    "overrides (key=value, group=option), -cd DIR, -n N",
                    "for a sweep, show each point's data with its values",
                )
            ]
        )
    inv.overrides = [o for o in inv.overrides if o.lstrip("+~").split("=", 1)[0] != "dry_run"] + ["dry_run=true"]
    master = precheck(inv)
    if master.prechecked is None:  # hydra.mode=MULTIRUN in a config file
        raise ConfigError(
            [Problem("hydra.mode", "MULTIRUN", "is a sweep; data show shows one experiment's data", "a single run")]
        )
    cfg = master.cfg
    with Composer(inv.config_dir, inv.config_name) as composer:  # Hydra's loader, for where values came from
        files = HydraFiles(composer.loader, inv.config_name, list(cfg.hydra.overrides.hydra))
        overrides = [str(o) for o in cfg.hydra.overrides.task]
        return check_job(cfg, files, overrides, run_dir=master.output_dir, prechecked=master.prechecked)
