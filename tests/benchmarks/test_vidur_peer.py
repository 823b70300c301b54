"""Where the Vidur benchmarks get Vidur's source: the pinned commit, cloned from what the user names,
or a one-line failure that says what to set."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import vidur_peer


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository shaped like Vidur's with two commits: (its path, the first, the second)."""
    repo = tmp_path / "origin"
    (repo / "vidur").mkdir(parents=True)
    git("init", "-q", cwd=repo)
    for version in ("1", "2"):
        (repo / "vidur" / "main.py").write_text(f"VERSION = {version}\n")
        git("add", ".", cwd=repo)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", version, cwd=repo)
    return repo, git("rev-parse", "HEAD~1", cwd=repo), git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def checkout_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "bench" / "vidur"
    monkeypatch.setattr(vidur_peer, "CHECKOUT", target)
    monkeypatch.delenv("VIDUR_GIT", raising=False)
    return target


def test_checks_out_the_pinned_commit_not_the_head(
    origin: tuple[Path, str, str], checkout_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, first, _ = origin
    monkeypatch.setattr(vidur_peer, "VIDUR_COMMIT", first)
    vidur_peer.checkout(str(repo))
    assert git("rev-parse", "HEAD", cwd=checkout_dir) == first
    assert (checkout_dir / "vidur" / "main.py").read_text() == "VERSION = 1\n"


def test_vidur_git_is_the_source_when_none_is_given(
    origin: tuple[Path, str, str], checkout_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, _, second = origin
    monkeypatch.setattr(vidur_peer, "VIDUR_COMMIT", second)
    monkeypatch.setenv("VIDUR_GIT", str(repo))
    vidur_peer.checkout(None)
    assert git("rev-parse", "HEAD", cwd=checkout_dir) == second


def test_a_source_without_the_commit_fails_saying_what_to_set(
    origin: tuple[Path, str, str], checkout_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, _, _ = origin
    monkeypatch.setattr(vidur_peer, "VIDUR_COMMIT", "0" * 40)
    with pytest.raises(SystemExit) as exited:
        vidur_peer.checkout(str(repo))
    message = str(exited.value)
    assert "has no commit 0000000" in message and "VIDUR_SRC" in message and "VIDUR_GIT" in message
    assert not checkout_dir.exists() and not checkout_dir.with_name("vidur.partial").exists()


def test_an_unreachable_source_fails_saying_what_to_set(tmp_path: Path, checkout_dir: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        vidur_peer.checkout(str(tmp_path / "nowhere"))
    message = str(exited.value)
    assert "not reachable from" in message and "VIDUR_SRC" in message and "\n" not in message
