"""The command line as a new user meets it: openai-whisper's spellings, --version, --debug
anywhere, the help's order, and one-line errors for what is not there (devices, models)."""

from __future__ import annotations

import argparse
import gc
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tensorplan import cli
from tensorplan.commands import openai_flags
from tensorplan.errors import ModelError, UserError
from tensorplan.whisper.model_files.find import OTHER_MODELS, find_in_dir, resolve_model

PARSER = cli.build_parser()


def parse(*argv: str) -> argparse.Namespace:
    return PARSER.parse_args(cli.openai_spellings(PARSER, argv))


def one_error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run main; assert exit 2 and one "tensorplan: error:" line; return that line."""
    assert cli.main(list(argv)) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorplan: error: "), lines
    return lines[0]


# ---- openai-whisper's spellings -------------------------------------------------------------
def _long_options() -> list[tuple[str, str]]:
    """(subcommand, option) for every --option with a dash in its name."""
    return [(name, option) for name, sub in cli._subcommands(PARSER).items()
            for option in cli._options(sub) if option.startswith("--") and "-" in option[2:]]


@pytest.mark.parametrize(("command", "option"), _long_options())
def test_every_flag_has_its_underscore_spelling(command: str, option: str) -> None:
    underscored = "--" + option[2:].replace("-", "_")
    assert cli.openai_spellings(PARSER, [command, underscored, "x"]) == [command, option, "x"]
    assert cli.openai_spellings(PARSER, [command, f"{underscored}=a_b"]) == [
        command, f"{option}=a_b"]


def test_openai_command_line_parses() -> None:
    args = parse("transcribe", "a_b.wav", "--output_dir", "out_dir", "--output_format", "srt",
                 "--beam_size", "1", "--word_timestamps", "True", "--max_line_width", "20",
                 "--initial_prompt", "snake_case words")
    assert args.audio == ["a_b.wav"] and args.output_dir == Path("out_dir")
    assert args.output_format == "srt" and args.beam_size == 1 and args.word_timestamps
    assert args.max_line_width == 20 and args.initial_prompt == "snake_case words"


@pytest.mark.parametrize(("words", "verbose"), [
    ((), True), (("--verbose",), True), (("--no-verbose",), False),
    (("--verbose", "False"), False), (("--verbose", "True"), True),
    (("--verbose=False",), False), (("--verbose", "false"), False),
])
def test_verbose_true_false(words: tuple[str, ...], verbose: bool) -> None:
    assert parse("transcribe", "a.wav", *words).verbose is verbose


def test_a_switch_before_a_file_keeps_the_file() -> None:
    args = parse("transcribe", "--verbose", "a.wav", "--condition_on_previous_text", "False")
    assert args.audio == ["a.wav"] and args.verbose and not args.condition_on_previous_text


def test_nothing_after_double_dash_changes() -> None:
    argv = ["transcribe", "--", "--output_dir", "False"]
    assert cli.openai_spellings(PARSER, argv) == argv


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"tensorplan {cli.version()}"
    assert cli.version()[0].isdigit()


def test_the_program_exits_with_mains_code_and_freezes_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """entry() (the `tensorplan` script, `python -m tensorplan`) exits with main's code; the
    freeze that spares the shutdown collection comes after main, never in main."""
    frozen_during_main = []
    monkeypatch.setattr(cli, "main", lambda program: frozen_during_main.append(
        gc.get_freeze_count()) or 3)
    try:
        with pytest.raises(SystemExit) as e:
            cli.entry()
        assert e.value.code == 3
        assert frozen_during_main == [0] and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # this test process goes on collecting


def test_python_m_tensorplan_runs_the_program() -> None:
    run = subprocess.run([sys.executable, "-m", "tensorplan", "pack", "missing.csv", "--out",
                          "o.csv"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "missing.csv" in run.stderr


@pytest.mark.parametrize("argv", [
    ("--debug", "pack", "missing.csv", "--out", "o.csv"),
    ("pack", "missing.csv", "--out", "o.csv", "--debug"),
    ("pack", "--debug", "missing.csv", "--out", "o.csv"),
])
def test_debug_anywhere_shows_the_traceback(argv: tuple[str, ...], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TENSORPLAN_DEBUG", raising=False)
    with pytest.raises(UserError):
        cli.main(list(argv))


def test_without_debug_an_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TENSORPLAN_DEBUG", raising=False)
    assert "missing.csv" in one_error_line(capsys, "pack", "missing.csv", "--out", "o.csv")
    assert parse("pack", "t.csv", "--out", "o.csv").debug is False


# ---- help -----------------------------------------------------------------------------------
def test_top_level_help_lists_exactly_the_commands() -> None:
    for name in cli.COMMANDS:  # no phantom: every listed command has its module
        importlib.import_module(f"tensorplan.commands.{name}")
    assert list(cli._subcommands(PARSER)) == list(cli.COMMANDS)
    text = PARSER.format_help()
    assert "bench" not in text and "export" in text


def _groups(command: str) -> dict[str, list[str]]:
    sub = cli._subcommands(PARSER)[command]
    return {g.title or "": [a.option_strings[0] for a in g._group_actions if a.option_strings]
            for g in sub._action_groups}


def test_transcribe_help_puts_everyday_options_first_and_planning_last() -> None:
    groups = _groups("transcribe")
    titles = [t for t, options in groups.items() if options]
    assert titles[1] == "everyday" and titles[-1] == "memory planning", titles
    for option in ("--model", "--output-dir", "--output-format", "--verbose", "--language",
                   "--task", "--beam-size", "--temperature", "--word-timestamps"):
        assert option in groups["everyday"], option
    for option in ("--plan", "--strategy", "--kv-dtype", "--weights-dtype"):
        assert option in groups["memory planning"], option
    help_text = cli._subcommands(PARSER)["transcribe"].format_help()
    assert help_text.index("--word-timestamps") < help_text.index("--plan")


# ---- openai-whisper's flags -----------------------------------------------------------------
def _args(**values: object) -> argparse.Namespace:
    defaults = {"device": "cpu", "fp16": None, "model_dir": None, "model": "tiny.en"}
    return argparse.Namespace(**{**defaults, **values})


def test_device_other_than_cpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, "transcribe", "a.wav", "--device", "cuda")
    assert "--device cuda" in line and "CUDA" in line
    openai_flags.apply(_args(device="cpu"))


@pytest.mark.parametrize(("fp16", "warns"), [(None, False), (False, False), (True, True)])
def test_fp16(fp16: bool | None, warns: bool, capsys: pytest.CaptureFixture[str]) -> None:
    openai_flags.apply(_args(fp16=fp16))
    err = capsys.readouterr().err
    expected = "tensorplan: warning: FP16 is not supported on CPU; using FP32 instead\n"
    assert err == (expected if warns else "")
    assert parse("transcribe", "a.wav", "--fp16", "False").fp16 is False


def test_threads_is_stored(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse("transcribe", "a.wav", "--threads", "3").threads == 3
    assert parse("transcribe", "a.wav").threads is None
    assert "threads must be between 0" in one_error_line(capsys, "transcribe", "a.wav",
                                                         "--threads", "-1")


def test_model_dir_finds_ct2_directories_and_pt_files(tmp_path: Path) -> None:
    (tmp_path / "medium").mkdir()
    (tmp_path / "medium" / "model.bin").write_bytes(b"")
    (tmp_path / "large-v3-turbo.pt").write_bytes(b"")
    (tmp_path / "mine.pt").write_bytes(b"")
    assert find_in_dir("medium", tmp_path) == tmp_path / "medium"
    assert find_in_dir("turbo", tmp_path) == tmp_path / "large-v3-turbo.pt"
    assert find_in_dir("mine", tmp_path) == tmp_path / "mine.pt"
    assert find_in_dir("small", tmp_path) is None  # then the packaged one, as without it
    args = _args(model="turbo", model_dir=tmp_path)
    openai_flags.apply(args)
    assert args.model == str(tmp_path / "large-v3-turbo.pt")
    with pytest.raises(UserError, match="no such directory"):
        openai_flags.apply(_args(model_dir=tmp_path / "nope"))


# ---- model names ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(OTHER_MODELS))
def test_known_model_names_say_what_to_pass(name: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no same-named directory here
    with pytest.raises(ModelError) as e:
        resolve_model(name)
    message = str(e.value)
    assert "\n" not in message and "--model PATH" in message and "CTranslate2" in message
    ct2, pt = OTHER_MODELS[name]
    assert ct2 in message and (pt is None or pt in message)


def test_model_hint_through_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    line = one_error_line(capsys, "transcribe", "a.wav", "--model", "large-v3")
    assert "large-v3.pt" in line and "Systran/faster-whisper-large-v3" in line


# ---- subtitle flags -------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [("--highlight_words", "True"), ("--max_line_width", "9"),
                                   ("--max-line-count", "2"), ("--max_words_per_line", "3")])
def test_subtitle_flags_need_word_timestamps(flags: tuple[str, ...],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, "transcribe", "a.wav", *flags)
    assert line.endswith("requires --word-timestamps")


def test_subtitle_flags_that_do_nothing_warn(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorplan.commands.transcribe import subtitle_options
    from tensorplan.whisper.writers import SubtitleOptions

    args = parse("transcribe", "a.wav", "--word_timestamps", "True", "--max_line_count", "2")
    assert subtitle_options(args) == SubtitleOptions(max_line_count=2)
    assert capsys.readouterr().err == (
        "tensorplan: warning: --max-line-count has no effect without --max-line-width\n")
    args = parse("transcribe", "a.wav", "--word-timestamps", "--max-line-width", "20",
                 "--max-words-per-line", "3", "--highlight-words")
    assert subtitle_options(args) == SubtitleOptions(20, None, 3, True)
    assert capsys.readouterr().err == (
        "tensorplan: warning: --max-words-per-line has no effect with --max-line-width\n")


# ---- one install story for PyTorch ----------------------------------------------------------
def test_every_pytorch_hint_says_the_same() -> None:
    """Hints name PyTorch's CPU build from its own index (PyPI's Linux default is CUDA)."""
    from tensorplan.backends import TORCH_INSTALL

    root = Path(__file__).resolve().parents[2]
    for path in (root / "src" / "tensorplan").rglob("*.py"):
        text = path.read_text()
        for other in ("pip install torch==", "pip install 'tensorplan[torch]'",
                      "pip install torch\"", "pip install torch'"):
            assert other not in text, f"{path.name}: {other!r}; say TORCH_INSTALL instead"
    assert TORCH_INSTALL in (root / "README.md").read_text()
    assert "../shared" not in (root / "README.md").read_text()


def test_an_openai_whisper_command_line_end_to_end(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    jfk = Path(__file__).resolve().parents[2] / "samples" / "jfk.wav"
    try:
        resolve_model("tiny.en")
    except ModelError as e:
        pytest.skip(str(e))
    argv = ["transcribe", str(jfk), "--model", "tiny.en", "--output_dir", str(tmp_path),
            "--output_format", "srt", "--word_timestamps", "True", "--max_line_width", "20",
            "--max_line_count", "2", "--beam_size", "1", "--temperature", "0",
            "--verbose", "False", "--fp16", "False", "--device", "cpu", "--threads", "2"]
    assert cli.main(argv) == 0
    assert "fellow Americans" in capsys.readouterr().out
    cues = (tmp_path / "jfk.srt").read_text().strip().split("\n\n")
    assert len(cues) > 2
    for cue in cues:
        lines = cue.splitlines()[2:]
        assert 1 <= len(lines) <= 2 and all(len(line) <= 20 for line in lines), cue
