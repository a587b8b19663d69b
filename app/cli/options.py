"""Option types the ``mem`` commands share, option groups that build a command's config, and the one way the commands
report a usage error.

An option is declared once, as a field of a config dataclass: its type, default, bounds and help (``Help`` and
``Range`` of ``mem_core.fields``); ``with_options`` makes the fields the command's options and hands the command the
dataclass built from them. A command module only says how a field is given in another form (``Converted``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup
from typer.models import OptionInfo, ParameterInfo

from mem_core.configuration import preset_names
from mem_core.fields import help_of

DatasetOpt = Annotated[
    str,
    typer.Option("--dataset", help="Dataset name: ncars, nmnist, ncaltech101, nimagenet, dsec-semantic, corpus, sim."),
]
DataOpt = Annotated[Path | None, typer.Option("--data", help="Dataset root or corpus directory.")]
OutOpt = Annotated[Path, typer.Option("--out", help="Run directory to write.")]
PRESETS_HELP = f"A bundled preset (configs/): {', '.join(preset_names())}."
PresetOpt = Annotated[str | None, typer.Option("--preset", help=PRESETS_HELP)]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="TOML config file (\\[input], \\[data], \\[vit] and per-stage tables).")
]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a config field: key=value (repeatable).")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run in --out.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (the last line of stdout).")]


class PlainHelp(TyperGroup):
    """A command group whose help, and its commands' and nested groups', reads plainly: a flag as ``--json``, not
    ``--json <bool>`` (typer prints a value type for every option, flags included), and a docstring's paragraphs
    flowed to the terminal's width (typer keeps the source's line breaks after the first paragraph)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return _plain(super().get_params(ctx))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _plain_tree(command, ctx)
        return command


def _plain_tree(command: click.Command, ctx: click.Context) -> None:
    _plain(command.get_params(ctx))  # (with its --help option)
    if command.help:
        command.help = "\n\n".join(" ".join(p.split()) for p in command.help.split("\n\n"))
    for sub in getattr(command, "commands", {}).values():
        _plain_tree(sub, ctx)


def _plain(params: list[click.Parameter]) -> list[click.Parameter]:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # what typer's help prints in place of "<bool>"
    return params


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` in red on stderr; raise the returned ``typer.Exit`` to end with ``code``."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=code)


def writable_file(path: Path | None) -> Path | None:
    """A typer callback for an option naming a file a command writes when it ends (``--json``): refused at once, in
    one line naming it, when it cannot be written (a folder, a FIFO, a name too long, a folder that is missing or
    not writable), not after the work is done. A file it had to create to find out is removed again."""
    if path is None:
        return None
    existed = os.path.lexists(path)
    try:  # without blocking: a FIFO with no reader is refused (ENXIO) instead of waited on
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644))
    except OSError as e:
        raise fail(f"{path}: cannot be written ({e.strerror or e})") from None
    if not existed:
        path.unlink()
    return path


@dataclasses.dataclass(frozen=True)
class Renamed:
    """An option's old spelling (``flag``, taking a value unless ``takes_value`` is false), refused in one line that
    names the new one: ``new``, and ``why`` the old name was given up."""

    flag: str
    new: str
    why: str
    takes_value: bool = True

    def refuse(self, value: Any) -> Any:
        """A typer callback: given at all, the old spelling ends the command (a script fails at once, not later)."""
        if value is None or value is False:
            return value
        given = f" {value}" if self.takes_value else ""
        raise fail(f"{self.flag}{given}: use {self.new}{given} ({self.why})")


def refusing(*renamed: Renamed) -> Callable[[Callable], Callable]:
    """Give a typer command the old spellings ``renamed`` as hidden options that refuse themselves (``Renamed``),
    so that each flag means one thing in every command."""

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func, eval_str=True)
        old = {f"renamed_{i}": r for i, r in enumerate(renamed)}
        parameters = [*signature.parameters.values()] + [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if r.takes_value else False,
                annotation=Annotated[
                    str | None if r.takes_value else bool, typer.Option(r.flag, hidden=True, callback=r.refuse)
                ],
            )
            for name, r in old.items()
        ]

        @functools.wraps(func)
        def command(**values: Any) -> Any:
            return func(**{name: value for name, value in values.items() if name not in old})

        command.__signature__ = signature.replace(parameters=parameters)  # what typer reads
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        return command

    return decorate


@dataclasses.dataclass(frozen=True)
class Converted:
    """A config field given on the command line in another form: ``option`` takes a ``type`` value, ``to_field``
    turns it into the field's value (a ``ValueError`` is a usage error naming the option) and ``to_option`` turns
    the field's default into the option's."""

    option: ParameterInfo
    type: Any
    to_field: Callable[[Any], Any]
    to_option: Callable[[Any], Any]


def comma_separated(option: ParameterInfo, item: Callable[[str], Any] = str) -> Converted:
    """A tuple field as comma-separated text (``--seeds 0,1,2``); blank items are left out."""
    return Converted(
        option,
        str,
        lambda text: tuple(item(part.strip()) for part in text.split(",") if part.strip()),
        lambda values: ",".join(map(str, values)),
    )


class _Field(typing.NamedTuple):
    """Where an option's value goes: the dataclass field ``name``, through ``to_field`` (``flag`` names the option
    in a usage error)."""

    name: str
    to_field: Callable[[Any], Any] | None
    flag: str

    def value(self, option_value: Any) -> Any:
        if option_value is None or self.to_field is None:
            return option_value
        try:
            return self.to_field(option_value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=self.flag) from None


def with_options(**declared: Mapping[str, ParameterInfo | Converted]) -> Callable[[Callable], Callable]:
    """Make a typer command of a function whose dataclass-typed parameters are built from options.

    Each parameter annotated with a dataclass becomes options in its place, one for each field that is an option
    (``_options``; ``declared[parameter]`` gives a field's option or ``Converted`` form). An option takes its
    field's type, default and help, and its name from its first flag; the function receives the dataclass built
    from the options' values (whose ``__post_init__`` checks their bounds). Other parameters stay as they are.
    """

    def decorate(func: Callable) -> Callable:
        hints = typing.get_type_hints(func)
        parameters: list[inspect.Parameter] = []
        groups: dict[str, tuple[type, dict[str, _Field]]] = {}
        for param in inspect.signature(func, eval_str=True).parameters.values():
            cls = hints.get(param.name)
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                parameters.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))  # typer passes keywords
                continue
            options = _options(cls, declared.get(param.name, {}))
            groups[param.name] = (cls, {option.name: field for option, field in options})
            parameters += [option for option, _ in options]

        @functools.wraps(func)
        def command(**values: Any) -> Any:
            for name, (cls, fields) in groups.items():
                values[name] = cls(**{field.name: field.value(values.pop(option)) for option, field in fields.items()})
            return func(**values)

        command.__signature__ = inspect.Signature(parameters)  # what typer reads
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        return command

    return decorate


def _options(cls: type, declared: Mapping[str, ParameterInfo | Converted]) -> list[tuple[inspect.Parameter, _Field]]:
    """The options of dataclass ``cls``'s fields, in field order: each one ``declared``, annotated with a typer
    option, or declared an option by its ``Help`` (``mem_core.fields``), which also gives an option its help."""
    types = typing.get_type_hints(cls)
    hints = typing.get_type_hints(cls, include_extras=True)
    options = []
    for field in dataclasses.fields(cls):
        name, about = field.name, help_of(cls, field.name)
        infos = [m for m in getattr(hints[name], "__metadata__", ()) if isinstance(m, ParameterInfo)]
        spec = declared.get(name) or (infos[0] if infos else None)
        if spec is None and about is not None:
            spec = typer.Option(about.flag or f"--{name.replace('_', '-')}")
        if spec is None:
            continue
        converted = spec if isinstance(spec, Converted) else None
        info = converted.option if converted else spec
        if info.help is None and about is not None:
            info.help = about.text
        flag = info.default.split("/")[0] if isinstance(info, OptionInfo) else name  # Option("--flag", ...)
        default = field.default
        if default is dataclasses.MISSING:
            default = inspect.Parameter.empty
        elif converted:
            default = converted.to_option(default)
        annotation = Annotated[converted.type if converted else types[name], info]
        option = flag.lstrip("-").replace("-", "_")
        parameter = inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
        options.append((parameter, _Field(name, converted.to_field if converted else None, flag)))
    unknown = sorted(set(declared) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
    return options


MB = 1 << 20
# a writer's room left on the disk, given in MB on the command line (``record``, ``ingest``, ``serve``)
MIN_FREE = Converted(typer.Option("--min-free-mb"), float, lambda mb: int(mb * MB), lambda size: size / MB)
