"""Tab completion of the `qwen3exp` console script (`qwen3exp.completion`, `qwen3exp.entry`): what a
TAB offers (the groups and options of the packaged and the user's config folders, the schema's keys
and values, the commands), checked against Hydra's own answers and compositions; and once for real
in bash: the installed function, the console script's answer, the uninstall. No timing here:
tests/bench/bench_completion.py measures the time per TAB."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from qwen3exp import cli, completion, completion_keys, entry
from qwen3exp.config.argv import GROUPS
from qwen3exp.config.compose import experiment_data
from qwen3exp.config.composer import Composer
from qwen3exp.launchers.job import COMMAND_ENV
from qwen3exp.run import rundir

MY_EXPERIMENT = "# @package _global_\nname: mine\n"


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    """The key table's cache in a folder of the test's own (not the user's ~/.cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def user_conf(tmp_path):
    """A team's config folder: an experiment and a model option of its own (tmp_path/conf)."""
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "my_exp.yaml").write_text(MY_EXPERIMENT)
    (conf / "model").mkdir()
    (conf / "model" / "tiny_one_layer.yaml").write_text("backend: native\nflavor: tiny\nn_layers: 1\n")
    return conf


def offered(line: str, cwd: Path | None = None) -> list[str]:
    return completion.candidates(line, cwd)


def test_the_users_config_folder_adds_its_options(user_conf):
    cwd = user_conf.parent
    for line in (
        "qwen3exp -cd conf experiment=",
        f"qwen3exp --config-dir {user_conf} -m experiment=",
        "qwen3exp --config-dir=conf experiment=",
        f"qwen3exp 'hydra.searchpath=[file://{user_conf}]' experiment=",
    ):
        found = offered(line, cwd)
        assert "experiment=my_exp" in found and "experiment=tiny_native" in found, line
    assert "experiment=my_exp" not in offered("qwen3exp experiment=", cwd)
    assert offered("qwen3exp -cd conf model=t", cwd) == ["model=tiny_one_layer"]
    assert offered("qwen3exp -cd conf experiment=my", cwd) == ["experiment=my_exp"]
    # -cp replaces the packaged folder: only its own options.
    assert offered("qwen3exp -cp conf experiment=", cwd) == ["experiment=my_exp"]


def test_group_options_are_hydras(user_conf):
    """Every group's options as Hydra's config loader lists them, with and without the user's folder."""
    search = f"hydra.searchpath=[file://{user_conf}]"
    with Composer() as c:
        for group in GROUPS:
            for line, overrides in ((f"qwen3exp {group}=", ()), (f"qwen3exp {search} {group}=", (search,))):
                hydra = [f"{group}={o}" for o in c.options(group, overrides)]
                assert offered(line) == hydra, line


def test_every_key_of_a_composition_is_offered():
    """Each key of composed experiments (the default one and one with the other variants) completes to
    `key=`, and every section on its way to `section.`."""
    variants = ["model=hf", "platform=cpu", "data=chat", "peft=lora", "eval=lm_eval", "launcher=slurm"]
    with Composer() as c:
        flat = {}
        for overrides in ([], variants):
            data, _ = experiment_data(c.compose(overrides))
            flat.update(rundir.flatten(data))
    assert len(flat) > 50
    for key in flat:
        assert f"{key}=" in offered(f"qwen3exp {key}"), key
        section, _, _ = key.rpartition(".")
        if section:
            assert f"{section}." in offered(f"qwen3exp {section}"), key
    assert offered("qwen3exp training.l") == ["training.local_batch_size=", "training.lr="]


def test_values_commands_and_flags():
    assert offered("qwen3exp dry_run=") == ["dry_run=false", "dry_run=true"]
    assert "model.attention=flex" in offered("qwen3exp model.attention=")
    assert offered("qwen3exp +tr") == ["+training."]
    assert set(completion.command_names()) == set(cli.COMMANDS) | {"relaunch"}
    first = offered("qwen3exp ")
    assert set(cli.COMMANDS) <= set(first) and {"relaunch", "model=", "training.", "hydra/"} <= set(first)
    assert offered("qwen3exp hydra/") == ["hydra/job_logging="]
    assert offered("qwen3exp data ") == ["show"] and "model=" in offered("qwen3exp data show mod")
    assert offered("qwen3exp relaunch ") == [] and offered("qwen3exp relaunch outputs/x tr") == ["training."]
    assert offered("qwen3exp report ") == offered("qwen3exp -cd ") == offered("qwen3exp --ver") == []
    assert offered("qwen3exp -m model=hf ") == offered("python -m qwen3exp -m ")
    assert "report" not in offered("qwen3exp -m ")  # a command is the first word only
    assert offered("qwen3exp --config-dir=con", REPO) == ["--config-dir=conf/"]
    assert offered("qwen3exp model.hf_assets_path=./con", REPO) == ["model.hf_assets_path=./conf/"]


def test_the_protocol():
    assert entry.completion_request(["-sc", "query=bash"]) == ("query", "bash")
    assert entry.completion_request(["--shell-completion", "install=fish"]) == ("install", "fish")
    for argv in (["-sc"], ["-sc", "query=tcsh"], ["-cd", "conf", "-sc", "query=bash"], ["model=hf"]):
        assert entry.completion_request(argv) is None, argv  # Hydra's (or the launch's) to answer
    env = {"COMP_LINE": "qwen3exp training.lr=1 dry_ru model=hf", "COMP_POINT": "29"}
    assert entry.typed_line(env) == "qwen3exp training.lr=1 dry_ru"
    assert entry.answer("query", "bash", env) == "dry_run=\n"
    both = {"COMP_LINE": "qwen3exp dry_run="}
    assert entry.answer("query", "bash", both) == "dry_run=false dry_run=true\n"
    assert entry.answer("query", "fish", both) == "dry_run=false\ndry_run=true\n"
    assert entry.answer("install", "zsh", {}) == entry.answer("install", "bash", {})


@pytest.mark.parametrize("line", ["qwen3exp training.", "qwen3exp experiment=", "qwen3exp platform=c"])
def test_the_answers_are_hydras_where_hydra_sees_the_same(line, monkeypatch, capsys):
    """Hydra's own query (what `-sc query=bash` printed before) gives the same words."""
    monkeypatch.setenv("COMP_LINE", line)
    monkeypatch.delenv(COMMAND_ENV, raising=False)  # main() sets it: put back after the test
    assert cli.main(["-sc", "query=bash"]) == 0
    hydra = capsys.readouterr().out
    assert entry.answer("query", "bash", {"COMP_LINE": line}).split() == hydra.split()


def test_the_key_table_is_cached_and_rebuilt_when_stale(cache_home):
    folder = cache_home / "qwen3exp"
    built = completion_keys.build()
    assert completion_keys.table() == built and (folder / completion_keys.CACHE_NAME).is_file()
    assert built["training.lr="] == [] and built["dry_run="] == ["true", "false"] and built["model."] == []
    cached = json.loads((folder / completion_keys.CACHE_NAME).read_text())
    assert cached["stamp"] == completion_keys.schema_stamp()
    # A cache from another schema, or one that is not a table, is rebuilt and written again.
    for stale in ({"stamp": "old", "table": {"gone=": []}}, {"stamp": cached["stamp"], "table": {"x=": 1}}, "[1"):
        (folder / completion_keys.CACHE_NAME).write_text(stale if isinstance(stale, str) else json.dumps(stale))
        assert completion_keys.table() == built
    assert json.loads((folder / completion_keys.CACHE_NAME).read_text()) == cached
    assert [p.name for p in folder.iterdir()] == [completion_keys.CACHE_NAME]
    # No writable cache folder: the table all the same.
    (cache_home / "file").write_text("")
    assert completion_keys.table(cache_home / "file" / "qwen3exp") == built


def test_a_tab_loads_neither_hydra_nor_torch_nor_the_cli(cache_home):
    """What makes a TAB fast, without timing it: with the key table cached, a TAB on a group option or a
    key imports neither pydantic (the schema) nor Hydra, torch or the command line."""
    completion_keys.table()
    code = (
        "import os, sys\n"
        "from qwen3exp import entry\n"
        "heavy = ('pydantic', 'hydra', 'omegaconf', 'torch', 'transformers', 'qwen3exp.cli', 'qwen3exp.launchers')\n"
        "for line in ('qwen3exp experiment=tiny_na', 'qwen3exp training.l'):\n"
        "    sys.argv, os.environ['COMP_LINE'] = ['qwen3exp', '-sc', 'query=bash'], line\n"
        "    try:\n"
        "        entry.entry()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    print(sorted({h for m in sys.modules for h in heavy if m == h or m.startswith(h + '.')}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["experiment=tiny_native", "[]", "training.local_batch_size= training.lr=", "[]"]


def test_bash_completion_for_real(user_conf):
    """`eval "$(qwen3exp -sc install=bash)"` in bash, a TAB after `qwen3exp -cd conf experiment=my`
    (the function runs the console script), then the uninstall."""
    steps = (
        'eval "$(qwen3exp -sc install=bash)"\n'
        "COMP_LINE='qwen3exp -cd conf experiment=my'; COMP_POINT=${#COMP_LINE}\n"
        '_qwen3exp_complete; echo "reply: ${COMPREPLY[*]}"\n'
        "complete -p qwen3exp\n"
        'eval "$(qwen3exp -sc uninstall=bash)"\n'
        "complete -p qwen3exp 2>/dev/null || echo removed\n"
    )
    assert _shell("bash", steps, user_conf.parent) == [
        "reply: experiment=my_exp",
        "complete -o default -o nospace -F _qwen3exp_complete qwen3exp",
        "removed",
    ]


def _shell(shell: str, steps: str, cwd: Path) -> list[str]:
    """The lines `shell -c steps` prints, run in `cwd` with this environment's console script first on PATH."""
    script = Path(sys.executable).parent / "qwen3exp"
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell} on this machine (.ci/run installs zsh and fish)")
    if not script.is_file():
        pytest.skip("the qwen3exp console script is not installed in this environment")
    env = {**os.environ, "PATH": f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([shell, "-c", steps], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_zsh_completion_for_real(user_conf):
    """zsh runs the bash code through bashcompinit (the README's line): installed, called as
    bashcompinit calls it after `qwen3exp -cd conf experiment=my`, then removed."""
    steps = (
        "autoload -U +X compinit && compinit -u && autoload -U +X bashcompinit && bashcompinit\n"
        'eval "$(qwen3exp -sc install=zsh)"\n'
        "COMP_LINE='qwen3exp -cd conf experiment=my'; COMP_POINT=${#COMP_LINE}\n"
        '_qwen3exp_complete; echo "reply: ${COMPREPLY[*]}"\n'
        'echo "registered: ${_comps[qwen3exp]}"\n'
        'eval "$(qwen3exp -sc uninstall=zsh)"\n'
        "(( ${+functions[_qwen3exp_complete]} )) || echo removed\n"
    )
    assert _shell("zsh", steps, user_conf.parent)[-3:] == [
        "reply: experiment=my_exp",
        "registered: _bash_complete -o nospace -o default -F _qwen3exp_complete",
        "removed",
    ]


def test_fish_completion_for_real(user_conf):
    """`qwen3exp -sc install=fish | source`, fish's own completion of three lines (an experiment of
    the user's folder; a bare path, where qwen3exp offers nothing and fish completes the path; a path
    key's value, which qwen3exp completes), then the uninstall."""
    steps = (
        "qwen3exp -sc install=fish | source\n"
        "complete -C 'qwen3exp -cd conf experiment=my'\n"
        "complete -C 'qwen3exp ./co'\n"
        "complete -C 'qwen3exp model.hf_assets_path=./co'\n"
        "qwen3exp -sc uninstall=fish | source\n"
        "functions -q _qwen3exp_complete; or echo removed\n"
    )
    assert _shell("fish", steps, user_conf.parent) == [
        "experiment=my_exp",
        "./conf/",
        "model.hf_assets_path=./conf/",
        "removed",
    ]
