"""The benchmark's words shared by its driver, its ranks and its report: what one training task runs
(a model spec, as text on the command line and in the results)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigurationError

__all__ = ["ModelSpec", "SCRIPT_PREFIX"]


@dataclass(frozen=True)
class ModelSpec:
    """What one training task runs, written as text on the command line and in the results:

    - a built-in model of paraflow.examples.models with integer size options, `name[:key=value,...]`
      (kind "builtin");
    - your factory, `MODULE:FUNCTION[:key=value,...]`, called with the options as string keyword
      arguments (kind "factory", see paraflow.bench.rank.factory);
    - your training script, `script::PATH` (kind "script", made by --script).
    """

    name: str
    options: tuple = ()
    kind: str = "builtin"

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse `mlp`, `mlp:width=1024`, `transformer:width=128,depth=4`, `mypkg.models:build:hidden=40`
        or `script::train.py`."""
        from ..examples.models import MODELS

        text = str(text).strip()
        if text.startswith(SCRIPT_PREFIX):
            return cls(text[len(SCRIPT_PREFIX) :], (), "script")
        name, _, rest = text.partition(":")
        if name in MODELS:
            return cls(name, _options(text, rest, integers=True))
        function, _, rest = rest.partition(":")
        if not name or not function.isidentifier() or not all(p.isidentifier() for p in name.split(".")):
            raise ConfigurationError(
                f"unknown model {text!r}: give a built-in one ({', '.join(MODELS)}, sizes as name:key=value,..., "
                "e.g. mlp:width=1024) or your factory as MODULE:FUNCTION[:key=value,...], "
                "e.g. mypkg.models:build:hidden=40."
            )
        return cls(f"{name}:{function}", _options(text, rest, integers=False), "factory")

    @property
    def kwargs(self) -> dict:
        """Keyword arguments for the model's builder (strings for a factory)."""
        return dict(self.options)

    @property
    def label(self) -> str:
        """`name` or `name(key=value,...)` (a script: its file name), for tables and plots."""
        if self.kind == "script":
            return self.name.replace("\\", "/").rsplit("/", 1)[-1]
        if not self.options:
            return self.name
        return f"{self.name}({','.join(f'{k}={v}' for k, v in self.options)})"

    def __str__(self) -> str:
        if self.kind == "script":
            return SCRIPT_PREFIX + self.name
        if not self.options:
            return self.name
        return f"{self.name}:{','.join(f'{k}={v}' for k, v in self.options)}"


#: How a script task is written in the results: `script::PATH`.
SCRIPT_PREFIX = "script::"


def _options(text: str, rest: str, integers: bool) -> tuple:
    options = []
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key.isidentifier() or not value or (integers and not value.isdigit()):
            kind = "<integer>" if integers else "<value>"
            example = "mlp:width=1024,depth=2" if integers else "mypkg.models:build:hidden=40,depth=2"
            raise ConfigurationError(f"model option {item!r} in {text!r} is not key={kind} (e.g. {example}).")
        options.append((key, int(value) if integers else value))
    return tuple(options)
