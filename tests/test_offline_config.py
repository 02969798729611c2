"""The run's offline keys: input, output, output_format, output_max_file_size,
off_policy_estimation_methods; each bad value is one line naming the key; a run with
`output` set writes each runner actor's files (what a worker writes: test_offline_output)."""

from __future__ import annotations

import pytest

from algorithms.algorithm import AlgorithmConfig
from policy_service.config import ConfigError, from_dict

DM_WITH_X = {"type": "DirectMethod", "x": 1}


def config(**values) -> AlgorithmConfig:
    return from_dict(AlgorithmConfig, {"env": "CartPole-v1", **values})


def test_defaults_sample_and_write_nothing():
    cfg = config()
    assert (cfg.input, cfg.output, cfg.output_format) == ("sampler", None, "parquet")
    assert cfg.output_max_file_size == 64 * 2**20


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"input": ""}, "config.input"),
        ({"input": []}, "config.input"),
        ({"input": ["a", ""]}, "config.input"),
        ({"input": 3}, "config.input"),
        ({"output": ""}, "config.output"),
        ({"output_format": "csv"}, "config.output_format"),
        ({"output_max_file_size": 0}, "config.output_max_file_size"),
        ({"shuffle_buffer_size": -1}, "config.shuffle_buffer_size"),
        ({"input": "d", "external_env": True}, "config.input"),
        ({"input": "d", "output": "o"}, "config.output"),
        ({"off_policy_estimation_methods": ["ImportanceSampling"]}, "config.off_policy_est"),
        ({"input": "d", "off_policy_estimation_methods": ["IS"]}, "config.off_policy_est"),
        (
            {"input": "d", "off_policy_estimation_methods": {"a": DM_WITH_X}},
            "config.off_policy_est",
        ),
        ({"input": "d", "off_policy_estimation_held_out": 1.0}, "config.off_policy_estimation_h"),
        ({"input": "d", "env": None, "evaluation_interval": 1}, "config.evaluation_interval"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key(values, key):
    with pytest.raises((ConfigError, TypeError)) as info:
        config(**values)
    message = str(info.value)
    assert message.startswith(key), message
    assert "\n" not in message


def test_estimators_by_list_or_by_rllib_dict_become_names():
    from policy_service.offline.config_keys import ESTIMATOR_OPTIONS

    cfg = config(input="d", off_policy_estimation_methods=list(ESTIMATOR_OPTIONS))
    assert cfg.off_policy_estimation_methods == {n: {"type": n} for n in ESTIMATOR_OPTIONS}
    dm = {"dm": {"type": "DirectMethod", "q_model_config": {"n_iters": 5}}}
    assert config(input="d", off_policy_estimation_methods=dm).off_policy_estimation_methods == dm


def test_the_builder_sets_them_by_rllib_names():
    cfg = (
        AlgorithmConfig()
        .environment("CartPole-v1")
        .offline_data(input_="logs/", output_format="json", shuffle_buffer_size=100)
    )
    assert (cfg.input, cfg.output_format, cfg.shuffle_buffer_size) == ("logs/", "json", 100)
    with pytest.raises(ConfigError, match=r"offline_data\(\): config.output_format"):
        cfg.offline_data(output_format="csv")


def test_a_config_naming_missing_input_still_builds():
    """Existence is checked where a run starts: a checkpoint's config must load after its
    data moved (serve, evaluate)."""
    assert config(input="/no/such/dir").input == "/no/such/dir"


@pytest.mark.parametrize("algorithm", ["impala", "appo", "a3c"])
def test_asynchronous_algorithms_refuse_input_in_one_line(algorithm):
    from algorithms import get_algorithm_class

    config_class = get_algorithm_class(algorithm).config_class
    with pytest.raises(ConfigError) as err:
        from_dict(config_class, {"input": "logs/", "rollout_fragment_length": 50})
    assert str(err.value).startswith("config.input: ") and "asynchronously" in str(err.value)


@pytest.mark.slow  # ~30 s: Ray and two runner actors
def test_each_runner_actor_writes_its_own_files(tmp_path):
    from algorithms.ppo import PPO
    from policy_service.data.sample_batch import concat_samples
    from policy_service.offline import open_experiences

    algo = PPO(
        {
            "env": "CartPole-v1",
            "num_env_runners": 2,
            "sample_while_env_runners_start": False,
            "train_batch_size": 200,
            "minibatch_size": 100,
            "output": str(tmp_path),
            "model": {"fcnet_hiddens": [8]},
            "seed": 0,
        }
    )
    try:
        for _ in range(2):
            result = algo.train()
    finally:
        algo.stop()
    files = list((tmp_path / "default_policy").glob("*.parquet"))
    writers = {f.name.rsplit("-", 1)[0] for f in files}
    assert len(writers) == 2
    written = concat_samples(list(open_experiences(tmp_path).iter_batches(100_000)))
    assert written.count == result["timesteps_total"] == 400
    assert set(written["weights_version"].tolist()) == {0, 1}  # the version that acted
