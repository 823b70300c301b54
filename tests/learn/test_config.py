import pytest

from rollflow.config import ConfigError
from tests.learn.conftest import tiny_config


def test_vidur_arc2_preset_fills_its_published_knobs_and_the_file_wins():
    config = tiny_config("preset=vidur_arc2", "ppo.min_temperature=0.7")
    assert (config.ppo.kl_start, config.ppo.kl_end, config.ppo.kl_decay_steps) == (0.6, 0.1, 3000)
    assert config.ppo.entropy_warmup_steps == 0 and config.ppo.min_temperature == 0.7
    assert config.reward.balance_weight == 0.1 and config.reward.credit == "time"
    assert config.bc.demonstrators == ["round_robin", "lor", "random"] and config.bc.keep_best == 0
    assert config.ppo.total_steps == 64  # sections the preset touches keep the file's other keys


def test_unknown_preset_and_demonstrator_are_named():
    with pytest.raises(ConfigError, match="preset"):
        tiny_config("preset=arc3")
    with pytest.raises(ConfigError, match=r"bc.demonstrators\[0\]"):
        tiny_config("bc.demonstrators=[psychic]")
