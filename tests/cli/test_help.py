"""Every command's --help says what the code does (issue 27, item 4): each choice a command accepts
appears in its help, each option's help text is shown whole (no "[...]" eaten as rich markup),
and no choice is listed that the command then refuses."""

import enum
import re
import typing

import pytest
import typer
from typer.testing import CliRunner

from sigprop import kinds
from sigprop.cli import build

app = build()
runner = CliRunner()
COMMAND = typer.main.get_command(app)


def _commands(group=COMMAND, path=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group (sigprop hessian)
            yield from _commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


def _choices(param) -> list[str]:
    """The values an option accepts when its annotation is an Enum (possibly in a list or Optional)."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None:  # typer before its own parser (0.12-0.2x): the Enum became a click.Choice
        return [str(c) for c in getattr(param.type, "choices", [])]
    todo = [descriptor.annotation]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, enum.Enum):
            return [e.value for e in t]
        todo += list(typing.get_args(t))
    return []


COMMANDS = sorted(_commands(), key=lambda c: c[0])


def _flat(text: str) -> str:
    """The rendered help as one line of words: box drawing and wrapping removed."""
    text = re.sub(r"[│╭╮╰╯─┃━]", " ", text)
    return " ".join(text.split())


def _render(path) -> str:
    res = runner.invoke(
        app, [*path, "--help"], env={"COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}, terminal_width=400
    )
    assert res.exit_code == 0, res.output
    return _flat(res.output)


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_shows_every_option_text_and_choice(path, cmd):
    shown = _render(path)
    for param in cmd.params:
        if getattr(param, "hidden", False):
            continue
        if getattr(param, "help", None):
            assert _flat(param.help.replace("\\[", "[")) in shown, (param.name, param.help)
        for choice in _choices(param):
            assert choice in shown, (param.name, choice)


#: the smallest run of each command that takes --format
TINY = {
    ("mlp",): ["--depth", "1", "--width", "3", "--input-dim", "4", "--samples", "3", "--init", "he"],
    ("resnet",): ["--blocks", "1", "--dim", "4", "--width", "3", "--samples", "3", "--init", "he"],
    ("cnn",): [
        "--depth",
        "1",
        "--strided",
        "0",
        "--channels",
        "2",
        "--image",
        "1x4x4",
        "--samples",
        "3",
        "--init",
        "he",
    ],
    ("wrn",): ["--blocks", "1", "--image", "1x4x4", "--samples", "3", "--init", "he"],
    ("theory",): ["--n", "3", "--blocks", "2"],
}
TINY.update(
    {("hessian", *k): v + ["--seeds", "1", "--iters", "2"] for k, v in list(TINY.items()) if k != ("theory",)}
)


@pytest.mark.parametrize("path", sorted(TINY), ids=[" ".join(p) for p in sorted(TINY)])
def test_every_listed_format_is_accepted(path):
    """0.7.0's `sigprop hessian --help` (and `sigprop theory`'s) listed csv and then refused it."""
    cmd = dict(COMMANDS)[path]
    fmt = next(p for p in cmd.params if p.name == "fmt")
    device = [] if path == ("theory",) else ["--device", "cpu"]
    for choice in _choices(fmt):
        res = runner.invoke(app, [*path, *TINY[path], *device, "--format", choice])
        assert res.exit_code == 0, (choice, res.output)


@pytest.mark.parametrize("name", list(kinds.KINDS))
def test_the_band_help_keeps_its_brackets_and_names_the_kinds_default(name):
    """Each probe command's --band help states its own default band (``Kind.band_help``), brackets kept."""
    shown = _render((name,))
    assert f"[default: {kinds.KINDS[name].band_help}]" in shown
    if kinds.KINDS[name].hints.residual:
        assert "[sqrt 2, sqrt e]" in shown


def test_the_wrn_help_names_bn_and_the_defaults_of_its_optional_sizes():
    shown = _render(("wrn",))
    assert "or bn (plain He convs" in shown
    assert "1666). [default: 16]" in shown and "64k channels. [default: 1]" in shown


def test_the_top_level_help_names_every_net_and_the_curvature():
    shown = _render(())
    for word in [*kinds.KINDS, "hessian", "--correlation"]:
        assert word in shown


def test_conv_nets_do_not_describe_pytorch_as_a_linear_layer():
    from sigprop import inits

    assert (
        "nn.Conv2d" in inits.get("pytorch").description
        and "weight_norm(nn.Linear)" not in inits.get("pytorch").description
    )
