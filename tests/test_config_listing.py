"""`policy-service config ALGO`: every key with its default, doc and allowed values,
as YAML that reads back to the algorithm's default config."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from algorithms import ALGORITHMS, get_algorithm_class
from policy_service.cli import commands as cli
from policy_service.cli.config_listing import yaml_flow
from policy_service.config import from_dict


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_the_listing_reads_back_as_the_default_config(name, capsys):
    """Every registered algorithm, the asynchronous and off-policy ones too."""
    config_class = get_algorithm_class(name).config_class
    assert cli.main(["config", name]) == 0
    listing = capsys.readouterr().out
    values = yaml.safe_load(listing)
    assert values == dataclasses.asdict(config_class())  # every key, every default
    assert from_dict(config_class, values) == config_class()  # a valid --config file


def test_each_key_comes_under_its_doc_and_allowed_values(capsys):
    assert cli.main(["config", "ppo"]) == 0
    lines = capsys.readouterr().out.splitlines()

    def comment_above(key: str) -> str:
        at = lines.index(key)
        start = at
        while lines[start - 1].lstrip().startswith("#"):
            start -= 1
        return " ".join(line.strip().lstrip("#").strip() for line in lines[start:at])

    # lr's rule is PolicyConfig's, inherited by PPO's redeclared default
    lr = comment_above("lr: 5.0e-05")
    assert lr == "Adam learning rate. Allowed: float: a finite number > 0."
    assert comment_above('grad_clip_method: "global_norm"') == (
        "Clip by global norm, by value, or by each tensor's norm. Allowed: str: one of "
        "['global_norm', 'value', 'norm']."
    )
    assert "an integer >= 1" in comment_above("  lstm_cell_size: 256")  # nested: model.*
    assert comment_above("model:") == "The model's shape."
    assert "exploration.py" in comment_above('exploration_config: {"type": "StochasticSampling"}')


@pytest.mark.parametrize("value", [5e-05, 1e20, 0.5, 3.0, -2.5e-7, 1800.0])
def test_floats_read_back_as_floats(value):
    assert yaml.safe_load(yaml_flow(value)) == value
    assert isinstance(yaml.safe_load(yaml_flow(value)), float)


def test_an_unknown_algorithm_is_one_line_naming_the_known_ones(capsys):
    assert cli.main(["config", "nosuch"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'nosuch'" in err and "'ppo'" in err
