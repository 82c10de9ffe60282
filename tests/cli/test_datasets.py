"""``datasets import|generate`` clear what interrupted writes left next to the output."""

from __future__ import annotations

import os

from neorl_industrial import cli
from neorl_industrial.integration.datasets import load_native, save_neorl_npz
from neorl_industrial.integration.datasets.native import STALE_STAGING_AGE
from tests.integration.datasets import make_dataset


def _staging(parent, name, age_s):
    staging = parent / f".{name}.k1ll3d.tmp"
    staging.mkdir(parents=True)
    (staging / "rewards.npy").write_bytes(b"\0" * 1024)
    stamp = os.stat(staging).st_mtime - age_s
    os.utime(staging, (stamp, stamp))
    return staging


def test_import_removes_stale_staging_and_says_so(tmp_path, capsys):
    source = tmp_path / "data.npz"
    save_neorl_npz(make_dataset(), source)
    out = tmp_path / "datasets" / "imported"
    stale = [_staging(out.parent, f"killed-{i}", 2 * STALE_STAGING_AGE) for i in range(3)]
    fresh = _staging(out.parent, "in-progress", 5)
    assert cli.main(["datasets", "import", str(source), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "removed 3 staging entries" in printed and "interrupted writes" in printed
    assert not any(path.exists() for path in stale) and fresh.is_dir()
    assert load_native(out)[0].n_transitions == 15


def test_generate_clears_before_generating(tmp_path, capsys):
    out = tmp_path / "random"
    stale = _staging(tmp_path, "random", 2 * STALE_STAGING_AGE)
    args = ["--no-cache", "datasets", "generate", "--env", "IB-classic-v0", "--quality", "random"]
    assert cli.main([*args, "--trajectories", "1", "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "removed 1 staging entry" in printed and "1,000 transitions" in printed
    assert not stale.exists() and out.is_dir()
