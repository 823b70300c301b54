"""Vidur, the peer of vidur_compare.py and search_vs_vidur.py: its source at one pinned commit and a
virtual environment of its own, both set up by the benchmark itself.

    .venv/bin/python benchmarks/vidur_peer.py    # only the setup, ahead of a timed suite

Vidur is not a dependency of rollflow and has no release to install, so the benchmarks take its
source from git: `--vidur-src` / `VIDUR_SRC` (a clone of microsoft/vidur, or any git repository that
holds the commit), else the URL in `VIDUR_GIT` (default GitHub). The pinned commit is checked out
into `.bench/vidur` and `.venv-vidur` is built from that checkout's requirements.txt with pip, plus
`ray` (its config explorer imports it, though the benchmark does not use its Ray runner). Both are
made once and reused while they match the pin; the source goes on Vidur's PYTHONPATH (not
installed), so Vidur runs its own code in its own interpreter and rollflow its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The commit of Vidur's public profiling data (../shared/data/vidur) and of docs/guides' reading.
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
VIDUR_GIT = "https://github.com/microsoft/vidur"
EXTRA_PACKAGES = ["ray==2.60.0"]  # the config explorer's import; pinned like rollflow's own
CHECKOUT = REPO / ".bench" / "vidur"
VENV = REPO / ".venv-vidur"
STAMP = VENV / ".installed"  # holds the commit and packages it was built for


@dataclass(frozen=True)
class Vidur:
    source: Path  # the checkout, the folder holding vidur/; goes on PYTHONPATH
    python: Path  # .venv-vidur's interpreter
    commit: str

    def env(self, **extra: str) -> dict[str, str]:
        """The environment Vidur's processes run in: its source first, no wandb, its venv on PATH
        (its config explorer starts `python -m vidur.main`)."""
        return {
            **os.environ,
            "PYTHONPATH": str(self.source),
            "PATH": str(self.python.parent) + os.pathsep + os.environ["PATH"],
            "WANDB_MODE": "disabled",
            **extra,
        }


def add_vidur_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vidur-src",
        default=os.environ.get("VIDUR_SRC"),
        help=f"a git repository holding Vidur's commit {VIDUR_COMMIT[:7]} (a clone of microsoft/vidur), "
        f"cloned into {CHECKOUT.relative_to(REPO)} (default: $VIDUR_SRC, else the URL in $VIDUR_GIT, "
        f"default {VIDUR_GIT})",
    )
    parser.add_argument(
        "--vidur-full-training",
        action="store_true",
        help="train Vidur's random forests over its 27-point grid with 10-fold CV (most of an hour cold) "
        "instead of one setting (vidur_compare.QUICK_TRAINING)",
    )


def ensure_vidur(source: str | None) -> Vidur:
    """The pinned checkout and its venv, made if missing; exits with one line saying what to set
    when the source or the packages cannot be had."""
    checkout(source)
    build_venv()
    return Vidur(CHECKOUT, VENV / "bin" / "python", VIDUR_COMMIT)


def checkout(source: str | None = None) -> None:
    """`.bench/vidur` at VIDUR_COMMIT, cloned from `source` (else $VIDUR_GIT) when it is not."""
    if _head(CHECKOUT) == VIDUR_COMMIT:
        return
    origin = source or os.environ.get("VIDUR_GIT") or VIDUR_GIT
    partial = CHECKOUT.with_name("vidur.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    clone = subprocess.run(
        ["git", "clone", "-q", "--no-checkout", str(origin), str(partial)],
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
    )
    pinned = clone.returncode == 0 and (
        subprocess.run(
            ["git", "-C", str(partial), "checkout", "-q", VIDUR_COMMIT], capture_output=True
        ).returncode
        == 0
    )
    if not pinned:
        shutil.rmtree(partial, ignore_errors=True)
        why = (
            clone.stderr.strip().splitlines()[-1]
            if clone.returncode
            else f"it has no commit {VIDUR_COMMIT[:7]}"
        )
        sys.exit(
            f"Vidur's source is not reachable from {origin} ({why}): set VIDUR_SRC (or --vidur-src) to a clone "
            f"of microsoft/vidur holding commit {VIDUR_COMMIT[:7]}, or VIDUR_GIT to a git URL that serves it"
        )
    shutil.rmtree(CHECKOUT, ignore_errors=True)
    partial.rename(CHECKOUT)


def _head(repo: Path) -> str | None:
    if not (repo / "vidur" / "main.py").is_file():
        return None
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def build_venv() -> None:
    """`.venv-vidur` with the checkout's requirements.txt and EXTRA_PACKAGES, unless already built
    for this commit and these packages; its pip log is kept beside it."""
    wanted = "\n".join([VIDUR_COMMIT, *EXTRA_PACKAGES]) + "\n"
    if STAMP.is_file() and STAMP.read_text() == wanted:
        return
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    log = REPO / ".bench" / "venv-vidur.log"
    with log.open("w") as out:
        install = subprocess.run(
            [
                str(VENV / "bin" / "pip"),
                "install",
                "-q",
                "-r",
                str(CHECKOUT / "requirements.txt"),
                *EXTRA_PACKAGES,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if install.returncode:
        sys.exit(
            f"building {VENV.relative_to(REPO)} from Vidur's requirements.txt failed (see {log}): "
            "pip needs a package registry; set PIP_INDEX_URL to one it can reach"
        )
    STAMP.write_text(wanted)


def venv_versions(
    vidur: Vidur, packages: tuple[str, ...] = ("numpy", "pandas", "scikit-learn")
) -> dict[str, str]:
    """What Vidur's requirements resolved to (they are unpinned), for the results file."""
    code = "import importlib.metadata as m, sys; print(*(m.version(p) for p in sys.argv[1:]))"
    out = subprocess.run(
        [str(vidur.python), "-c", code, *packages], capture_output=True, text=True, check=True
    )
    return dict(zip(packages, out.stdout.split(), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_vidur_options(parser)
    vidur = ensure_vidur(parser.parse_args().vidur_src)
    print(f"Vidur {vidur.commit[:7]} in {vidur.source}, its Python {vidur.python}: {venv_versions(vidur)}")


if __name__ == "__main__":
    main()
