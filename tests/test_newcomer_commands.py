"""A newcomer's first hour: `qwen3exp ls` (the experiments, packaged and yours), `qwen3exp cp` (a
packaged experiment as a file of your own), and the slips of a first command line (`qwen3exp train`,
`reprot`, `training.lr 1e-3`, `--dry-run`, `x.yaml`, `experiment=mine` without `-cd conf`), each
answered with exit 2, the command that was meant, and no traceback. In-process through
`qwen3exp.cli.main`, and once through `python -m qwen3exp` from a user's folder."""

from __future__ import annotations

import pytest

from conftest import CONF, run_cli
from qwen3exp.cli import COMMANDS, main
from qwen3exp.config.argv import parse_argv
from qwen3exp.config.catalog import description
from qwen3exp.config.choices import shadowed
from qwen3exp.config.compose import experiment_data
from qwen3exp.config.composer import Composer
from qwen3exp.config.schema import check_experiment
from qwen3exp.launchers.job import COMMAND_ENV

PACKAGED = CONF / "experiment"
MINE = """\
# @package _global_
# Run:  qwen3exp -cd conf experiment=mine
# Why: my own tiny run
name: mine
"""


@pytest.fixture(autouse=True)
def user_repo(tmp_path, monkeypatch):
    """A user's folder (the current directory) holding conf/experiment/mine.yaml; main() records
    the command line in the environment, which is restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(COMMAND_ENV, raising=False)
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text(MINE)
    return tmp_path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_ls_lists_packaged_and_yours_with_their_descriptions(capsys, user_repo, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # the descriptions are cut to the terminal's width
    (user_repo / "conf" / "experiment" / "tiny_sft.yaml").write_text("# @package _global_\nname: x\n")
    code, out, _ = cli(capsys, "ls")
    assert code == 0
    lines = out.splitlines()
    for path in PACKAGED.glob("*.yaml"):
        assert any(line.split()[:2] == [path.stem, "packaged"] for line in lines), path.stem
    native = next(line for line in lines if line.split()[:1] == ["tiny_native"])
    assert description(PACKAGED / "tiny_native.yaml")[:40] in native and "Why:" not in native
    assert description(PACKAGED / "tiny_native.yaml").startswith("a real torchtitan Qwen3 training")
    mine = next(line for line in lines if line.split()[:1] == ["mine"])
    assert mine.split()[1] == "yours" and "my own tiny run" in mine
    assert "qwen3exp -cd conf experiment=NAME" in out
    assert "has a packaged experiment's name" in out and "rename it (e.g. my_tiny_sft.yaml)" in out


def test_ls_reads_the_folder_of_cd_and_says_when_there_is_none(capsys, user_repo):
    other = user_repo / "team" / "experiment"
    other.mkdir(parents=True)
    (other / "big.yaml").write_text("# a big one\nname: big\n")
    code, out, _ = cli(capsys, "ls", "-cd", "team")
    assert code == 0 and "big" in out and "a big one" in out and "mine" not in out
    (user_repo / "conf" / "experiment" / "mine.yaml").unlink()
    (user_repo / "conf" / "experiment").rmdir()
    code, out, _ = cli(capsys, "ls")
    assert code == 0 and "yours: none" in out
    code, _, err = cli(capsys, "ls", "-cd", "nowhere")
    assert code == 2 and "nowhere" in err


def test_cp_copies_a_packaged_experiment_that_composes_as_yours(capsys, user_repo):
    code, out, _ = cli(capsys, "cp", "tiny_native", "mine2")
    assert code == 0
    assert "next: qwen3exp -cd conf experiment=mine2 dry_run=true" in out
    copy = (user_repo / "conf" / "experiment" / "mine2.yaml").read_text().splitlines()
    original = (PACKAGED / "tiny_native.yaml").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, copy, strict=True) if a != b]
    assert changed == [  # the name and the header's run line (it named the packaged one); every other line kept
        ("# python -m qwen3exp experiment=tiny_native   (the default run)",
         "# qwen3exp -cd conf experiment=mine2   (copied from tiny_native)"),
        ("name: tiny_native", "name: mine2"),
    ]  # fmt: skip
    inv = parse_argv(["-cd", "conf", "experiment=mine2"])
    with Composer(inv.config_dir, inv.config_name) as c:
        cfg = c.compose(inv.overrides)
    data, problems = experiment_data(cfg)
    assert problems == [] and shadowed(cfg) == []
    assert check_experiment(data).exp.name == "mine2"


def test_cp_never_overwrites_and_defaults_to_a_name_hydra_does_not_hide(capsys, user_repo):
    target = user_repo / "conf" / "experiment" / "mine.yaml"
    code, _, err = cli(capsys, "cp", "tiny_hf", "mine")
    assert code == 2 and str(target.relative_to(user_repo)) in err and "never overwrites" in err
    assert target.read_text() == MINE
    code, out, _ = cli(capsys, "cp", "tiny_sft")  # NEW: my_tiny_sft (tiny_sft would be shadowed)
    assert code == 0 and (user_repo / "conf" / "experiment" / "my_tiny_sft.yaml").is_file()
    code, _, err = cli(capsys, "cp", "tiny_sft", "tiny_hf")
    assert code == 2 and "packaged experiment's name" in err
    code, _, err = cli(capsys, "cp", "tiny_sft", "a/b")
    assert code == 2 and "not an experiment name" in err
    code, out, _ = cli(capsys, "cp", "tiny_lora", "x", "-cd", "team")
    assert code == 0 and (user_repo / "team" / "experiment" / "x.yaml").is_file() and "-cd team" in out


def test_cp_of_an_unknown_name_lists_the_names(capsys):
    code, _, err = cli(capsys, "cp", "tiny_nativ")
    assert code == 2 and "did you mean tiny_native?" in err and "tiny_sweep" in err


SLIPS = [
    (["reprot", "outputs/x"], "unknown command 'reprot'", "did you mean 'report'? qwen3exp report outputs/x"),
    (["lst"], "unknown command 'lst'", "did you mean 'ls'?"),
    (["train"], "unknown command 'train'", "a launch has no command word"),
    (["training.lr", "1e-3"], "a key and its value are one word", "did you mean training.lr=1e-3?"),
    (["--dry-run"], "unknown flag", "did you mean dry_run=true?"),
    (["--dry_run"], "unknown flag", "did you mean dry_run=true?"),
    (["--name", "x"], "unknown flag", "did you mean name=x?"),
    (["train", "x.yaml"], "chosen by name, not by its file", "experiment=NAME"),
    (
        ["conf/experiment/mine.yaml", "training.steps=3"],
        "chosen by name, not by its file",
        "run this file with: qwen3exp -cd conf experiment=mine training.steps=3",
    ),
    (
        ["experiment=mine", "dry_run=true"],
        "no option 'mine' in config group 'experiment'",
        "add `-cd conf`: qwen3exp -cd conf experiment=mine dry_run=true",
    ),
    (["-cd", "conf", "experiment=mine.yaml"], "named without .yaml", "qwen3exp -cd conf experiment=mine"),
]


@pytest.mark.parametrize(("argv", "message", "hint"), SLIPS, ids=[" ".join(s[0]) for s in SLIPS])
def test_a_slip_gets_the_command_that_was_meant(capsys, argv, message, hint):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and message in err and hint in err
    assert "missing EQUAL" not in err


def test_eval_is_a_command_and_its_slips_name_it(capsys):
    """`eval` is a command: a misspelling is pointed at it, and `eval` without its run directory (or
    with a folder that is none) answers with exit 2 and its usage, never as an override."""
    assert "eval" in COMMANDS
    code, _, err = cli(capsys, "evla")
    assert code == 2 and "unknown command 'evla'" in err and "did you mean 'eval'? qwen3exp eval" in err
    code, _, err = cli(capsys, "eval")
    assert code == 2 and "usage: qwen3exp eval" in err and "required: run" in err
    code, _, err = cli(capsys, "eval", "nope")
    assert code == 2 and "nope: not a directory" in err


def test_other_mistakes_keep_their_messages(capsys):
    assert parse_argv(["--verbose"]).overrides[0] == "verbose=true"  # a flag qwen3exp reads
    assert parse_argv(["experiment=nope", "~training.lr"]).overrides[:2] == ["experiment=nope", "~training.lr"]
    code, _, err = cli(capsys, "training.lr==5")
    assert code == 2 and "cannot parse" in err
    code, _, err = cli(capsys, "--fast")
    assert code == 2 and "unknown flag" in err and "did you mean" not in err


def test_ls_and_cp_from_a_users_folder(tmp_path):
    """`python -m qwen3exp ls` and `cp` the way a user runs them, from their own folder."""
    r = run_cli("cp", "tiny_native", "mine2", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "conf" / "experiment" / "mine2.yaml").is_file()
    r = run_cli("ls", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert any(line.split()[:2] == ["mine2", "yours"] for line in r.stdout.splitlines())
