"""The `qwen3exp` console script and `python -m qwen3exp`: a shell's tab completion is answered here,
everything else goes to `qwen3exp.cli`.

Why a module of its own: a shell runs `qwen3exp -sc query=bash` at every TAB, and qwen3exp.cli
imports the launchers, the analysis and Hydra at its top (2 s and more on a loaded machine) before
Hydra composes the config to answer. Here a TAB costs the interpreter and a few files read
(`qwen3exp.completion` finds the candidates; tests/bench/bench_completion.py measures both paths).

The protocol is Hydra's, so a function Hydra's own `-sc install=bash` put into a shell keeps working:
- `-sc install=bash|zsh|fish` prints the shell code that registers the completion of `qwen3exp`
  (`eval "$(qwen3exp -sc install=bash)"`; zsh runs the bash code through `bashcompinit`, as with
  Hydra; `qwen3exp -sc install=fish | source`); `uninstall=SHELL` prints the code that removes it;
- `-sc query=SHELL` reads the line from COMP_LINE (up to COMP_POINT, the cursor, where the shell
  sets it) and prints the candidates: bash and zsh on one line separated by spaces, fish one a line.
Any other use of `-sc`/`--shell-completion` goes to Hydra, as before.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from qwen3exp import completion
from qwen3exp.run import stopping

PROGRAM = "qwen3exp"
"""The command the completion is registered for (the console script; `python -m` is not completed)."""
SHELLS = ("bash", "zsh", "fish")
ACTIONS = ("install", "uninstall", "query")

# bash (zsh: through bashcompinit). `=` leaves COMP_WORDBREAKS, as Hydra's function does, so that
# `experiment=tiny_hf` is one word; the query itself keeps only the candidates of the word at the
# cursor, and an empty answer leaves the word to the shell's file names (-o default).
BASH_INSTALL = f"""\
case $(complete -p {PROGRAM} 2>/dev/null) in
    *_qwen3exp_complete*) ;;
    *) _qwen3exp_old_complete=$(complete -p {PROGRAM} 2>/dev/null) ;;
esac
_qwen3exp_complete() {{
    local line=${{COMP_LINE#"${{COMP_LINE%%[! ]*}}"}}
    COMPREPLY=( $(COMP_LINE=$COMP_LINE COMP_POINT=$COMP_POINT "${{line%% *}}" -sc query=bash 2>/dev/null) )
}}
COMP_WORDBREAKS=${{COMP_WORDBREAKS//=}}
complete -o nospace -o default -F _qwen3exp_complete {PROGRAM}
"""
BASH_UNINSTALL = f"""\
complete -r {PROGRAM} 2>/dev/null
eval "${{_qwen3exp_old_complete:-}}"
unset -f _qwen3exp_complete
unset _qwen3exp_old_complete
"""
FISH_INSTALL = f"""\
function _qwen3exp_complete
    set -lx COMP_LINE (commandline -cp)
    set -l cmd (commandline -cpo)[1]
    set -l found ($cmd -sc query=fish 2>/dev/null)
    if test (count $found) -gt 0
        printf '%s\\n' $found
    else
        __fish_complete_path (commandline -ct)
    end
end
complete -c {PROGRAM} -x -a '(_qwen3exp_complete)'
"""
FISH_UNINSTALL = f"""\
complete -e -c {PROGRAM}
functions -e _qwen3exp_complete
"""
SCRIPTS = {
    ("install", "bash"): BASH_INSTALL,
    ("install", "zsh"): BASH_INSTALL,
    ("install", "fish"): FISH_INSTALL,
    ("uninstall", "bash"): BASH_UNINSTALL,
    ("uninstall", "zsh"): BASH_UNINSTALL,
    ("uninstall", "fish"): FISH_UNINSTALL,
}


def completion_request(argv: list[str]) -> tuple[str, str] | None:
    """(action, shell) for `-sc install|uninstall|query=SHELL`, the command lines the shell code and
    the docs use; None for every other command line."""
    if len(argv) != 2 or argv[0] not in ("-sc", "--shell-completion"):
        return None
    action, _, shell = argv[1].partition("=")
    return (action, shell) if action in ACTIONS and shell in SHELLS else None


def answer(action: str, shell: str, env: Mapping[str, str]) -> str:
    """What `qwen3exp -sc ACTION=SHELL` prints."""
    if action != "query":
        return SCRIPTS[(action, shell)]
    found = completion.candidates(typed_line(env))
    # Nothing at all when nothing is found: fish reads an empty line as one empty candidate, not as
    # none, and would not fall back to completing a path.
    return ("\n" if shell == "fish" else " ").join(found) + "\n" if found else ""


def typed_line(env: Mapping[str, str]) -> str:
    """COMP_LINE up to the cursor: COMP_POINT counts bytes from the start of the line (bash's
    readline point); without it (fish passes the line up to the cursor) the whole line."""
    line = env.get("COMP_LINE", "")
    point = env.get("COMP_POINT", "")
    if not point.isdigit():
        return line
    return line.encode()[: int(point)].decode(errors="ignore")


def entry() -> None:
    """The console script's `main`: a completion request is answered and the process exits;
    everything else is `qwen3exp.cli.entry()`."""
    # First: Ctrl-C, SIGTERM and SIGHUP stop the command with 130 / 143 from here to its last
    # instruction, also while the command line is imported (qwen3exp.run.stopping says why).
    stopping.install()
    request = completion_request(sys.argv[1:])
    if request is not None:
        sys.stdout.write(answer(*request, os.environ))
        sys.stdout.flush()
        sys.exit(0)
    try:
        from qwen3exp import cli  # lazy: the launchers, the analysis and Hydra; a TAB needs none of them
    except BaseException:
        if stopping.received() is None:
            raise
        # The signal, or what a library raised while the signal unwound it (omegaconf's flag_override
        # then fails with AttributeError): the import was cut short, nothing else ran.
        stopping.silence()
        print("qwen3exp: stopped before anything started; nothing was kept", file=sys.stderr, flush=True)
        os._exit(stopping.last_code(130))  # no finalization of half-imported modules
    cli.entry()
