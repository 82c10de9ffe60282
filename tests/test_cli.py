"""The neorl-industrial command line."""

from __future__ import annotations

import pytest

from neorl_industrial import cli


def test_envs_lists_every_registered_environment(capsys):
    assert cli.main(["--no-cache", "envs"]) == 0
    out = capsys.readouterr().out
    for env_id in ("IB-v0", "IB-classic-v0", "IB-discrete-v0", "IB-nonstationary-v0"):
        assert env_id in out


def test_rollout_reports_returns_and_costs(capsys):
    code = cli.main(
        [
            "--no-cache",
            "rollout",
            "--env",
            "IB-classic-v0",
            "--policy",
            "hold",
            "--n-envs",
            "4",
            "--n-steps",
            "1000",
            "--setpoint",
            "40",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "IB-classic-v0" in out and "hold" in out
    # Four environments, one full episode each, and holding the setting is safe.
    row = next(line for line in out.splitlines() if "IB-classic-v0" in line)
    cells = [cell.strip() for cell in row.split("│") if cell.strip()]
    assert cells[:3] == ["IB-classic-v0", "hold", "4"]
    assert cells[4:6] == ["0.0", "0.0"]


def test_run_rollouts_measures_a_rollout():
    report = cli.run_rollouts("IB-classic-v0", "random", n_envs=3, n_steps=1000, seed=0)
    assert report.episodes == 3
    assert report.mean_return < 0
    assert report.mean_episode_cost.shape == (2,)
    assert report.steps_per_second > 0 and report.compile_seconds > 0


def test_bad_input_is_a_clear_error(capsys):
    assert cli.main(["--no-cache", "rollout", "--setpoint", "120"]) == 2
    assert "setpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["rollout", "--n-envs", "0"])
    with pytest.raises(SystemExit):
        cli.main(["rollout", "--env", "IB-v9"])


def test_compilation_cache_goes_where_asked(tmp_path, monkeypatch):
    import jax

    from neorl_industrial.runtime import CACHE_ENV, default_cache_dir, enable_compilation_cache

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    previous = jax.config.jax_compilation_cache_dir
    try:
        path = enable_compilation_cache()
        assert path.is_dir()
        assert jax.config.jax_compilation_cache_dir == str(path)
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)


def test_datasets_generate_inspect_and_import(tmp_path, capsys):
    out = tmp_path / "random"
    args = ["--no-cache", "datasets", "generate", "--env", "IB-classic-v0", "--quality", "random"]
    assert cli.main([*args, "--trajectories", "2", "--out", str(out)]) == 0
    assert "2,000 transitions" in capsys.readouterr().out
    # Nothing is overwritten without being asked.
    assert cli.main([*args, "--trajectories", "2", "--out", str(out)]) == 2
    assert cli.main(["--no-cache", "datasets", "inspect", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "n_transitions" in summary and "2000" in summary
    from neorl_industrial.integration.datasets import load_native, save_neorl_npz

    dataset, _ = load_native(out)
    save_neorl_npz(dataset, tmp_path / "data.npz")
    imported = tmp_path / "imported"
    assert cli.main(["datasets", "import", str(tmp_path / "data.npz"), "--out", str(imported)]) == 0
    again, _ = load_native(imported)
    assert again.n_transitions == 2000
