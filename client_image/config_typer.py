"""The Typer options of a `ClientConfig` (client_image/client_config.py), made from its fields.

    @app.command("train")
    @client_config_options
    def train(config: ClientConfig) -> None: ...

adds one option per config field, in the tree's order, with the field's flag, environment
variable, help, bounds and default; the wrapped function receives the one `ClientConfig`
built from them. The same shape as psyche_common.telemetry.options.telemetry_options, which
can wrap the result.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from client_image.client_config import ClientConfig, ConfigOption, config_options

F = TypeVar("F", bound=Callable[..., Any])


def typer_parameter(option: ConfigOption) -> inspect.Parameter:
    """The keyword parameter Typer reads one config field's option from."""
    spec = option.spec
    info = typer.Option(option.flag, envvar=spec.env, help=spec.help, min=spec.min,
                        max=spec.max, show_default=spec.show_default)
    default = inspect.Parameter.empty if option.default is dataclasses.MISSING else option.default
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[option.type, info])


def client_config_options(func: F) -> F:
    """Replace the `config: ClientConfig` parameter of a Typer command by the config's options."""
    signature = inspect.signature(func, eval_str=True)
    if "config" not in signature.parameters:
        raise TypeError(f"{func.__name__} needs a `config: ClientConfig` parameter")
    kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in signature.parameters.values() if p.name != "config"]
    added = [typer_parameter(option) for option in config_options()]
    new_signature = signature.replace(parameters=[*added, *kept])
    names = [option.name for option in config_options()]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in names if name in kwargs}
        kwargs["config"] = ClientConfig.of(**values)
        return func(*args, **kwargs)

    wrapper.__signature__ = new_signature  # type: ignore[attr-defined]  # read by inspect.signature; not in typeshed
    wrapper.__annotations__ = {p.name: p.annotation for p in new_signature.parameters.values()}
    wrapper.__annotations__["return"] = signature.return_annotation
    del wrapper.__wrapped__  # Typer must see the new signature
    return wrapper  # type: ignore[return-value]  # functools.wraps' type is not F
