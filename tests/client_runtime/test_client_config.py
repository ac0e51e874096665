"""The client's options exist once (client_image/client_config.py): `psyche-client train`'s
options are exactly the config's fields, and each field is set by its flag or its
environment variable."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner, Result

from client_image.cli import app
from client_image.client_config import ClientConfig, ConfigOption, config_options
from client_image.config_typer import client_config_options

runner = CliRunner()
TELEMETRY_FLAGS = ("--otlp-", "--oltp-", "--prometheus-")  # TelemetryOptions' (psyche_common)


def _train_options() -> dict[str, Any]:
    train = typer.main.get_group(app).commands["train"]
    return {param.name: param for param in train.params if param.param_type_name == "option"
            and param.name != "help" and not param.opts[0].startswith(TELEMETRY_FLAGS)}


def test_every_train_option_is_one_config_field_and_every_field_one_option() -> None:
    options = _train_options()
    fields = {option.name: option for option in config_options()}
    assert len(fields) == len(config_options())  # field names are unique across the tree
    assert set(options) == set(fields)
    for name, param in options.items():
        field = fields[name]
        flag, _, negative = field.flag.partition("/")
        assert param.opts == [flag], name
        assert param.secondary_opts == ([negative] if negative else []), name
        assert param.envvar == field.spec.env, name
        assert param.help == field.spec.help, name
        assert param.required == (field.default is dataclasses.MISSING), name
        if not param.required:
            assert param.default == field.default, name


def test_the_tree_groups_every_field_under_one_component() -> None:
    config = ClientConfig.of(run_id="r")
    for option in config_options():
        expected = "r" if option.name == "run_id" else option.default  # the one required field
        assert getattr(getattr(config, option.component), option.name) == expected


def _probe(args: list[str], env: dict[str, str]) -> tuple[Result, list[ClientConfig]]:
    """Run a command made by client_config_options (the decorator `train` uses) and keep the
    config it receives."""
    seen: list[ClientConfig] = []
    probe = typer.Typer()

    @probe.command()
    @client_config_options
    def show(config: ClientConfig) -> None:
        seen.append(config)

    return runner.invoke(probe, args, env=env), seen


def _sample(option: ConfigOption) -> tuple[str, Any]:
    """An environment value for the option, other than its default, and the value it means."""
    if typing.get_origin(option.type) is typing.Literal:  # a choice: another of its values
        choice = next(c for c in typing.get_args(option.type) if c != option.default)
        return str(choice), choice
    kinds = {t for t in typing.get_args(option.type) if t is not types.NoneType} or {option.type}
    kind = kinds.pop()
    if kind is bool:
        return ("false", False) if option.default is True else ("true", True)
    if kind is int:
        return "3", 3
    if kind is float:
        return "0.5", 0.5
    if kind is Path:
        return "/some/dir", Path("/some/dir")
    return "a-value", "a-value"


@pytest.mark.parametrize("option", [o for o in config_options() if o.spec.env],
                         ids=lambda o: o.spec.env)
def test_each_environment_variable_sets_its_field(option: ConfigOption) -> None:
    text, value = _sample(option)
    env = {"RUN_ID": "from-env", option.spec.env or "": text}
    result, seen = _probe([], env)
    assert result.exit_code == 0, result.output
    assert getattr(getattr(seen[0], option.component), option.name) == value


def test_a_flag_wins_over_its_environment_variable() -> None:
    result, seen = _probe(["--keep-steps", "7", "--run-id", "flag"],
                          {"KEEP_STEPS": "5", "RUN_ID": "env"})
    assert result.exit_code == 0, result.output
    assert (seen[0].checkpoints.keep_steps, seen[0].connection.run_id) == (7, "flag")


def test_a_bad_environment_value_is_a_usage_error_naming_the_option() -> None:
    result, seen = _probe([], {"RUN_ID": "r", "KEEP_STEPS": "0"})
    assert result.exit_code == 2 and not seen
    assert "--keep-steps" in result.output and "Traceback" not in result.output


def test_flat_names_build_and_change_the_tree() -> None:
    config = ClientConfig.of(run_id="r", keep_steps=5, device="cpu")
    assert (config.connection.run_id, config.checkpoints.keep_steps) == ("r", 5)
    changed = config.replace(device="cuda:1")
    assert (changed.training.device, config.training.device) == ("cuda:1", "cpu")
    assert changed.checkpoints is config.checkpoints  # untouched components are shared
    with pytest.raises(TypeError, match="not a client config field: kep_steps"):
        ClientConfig.of(run_id="r", kep_steps=5)


def test_the_runtime_takes_a_resolved_device_only() -> None:
    from client_image.p2p import NodeConfig
    from client_image.runtime.client import ClientOptions
    from psyche_common.identity import Identity

    with pytest.raises(ValueError, match="resolved device"):
        ClientOptions(ClientConfig.of(run_id="r"), identity=Identity.generate(),
                      node_config=NodeConfig.loopback())
    options = ClientOptions(ClientConfig.of(run_id="r", device="cpu"),
                            identity=Identity.generate(), node_config=NodeConfig.loopback())
    assert options.runner_options().checkpoints.keep_steps == 3
