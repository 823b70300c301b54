"""Install dist/gpu-wheels for `make bench-gpu`, offline, with the GPU machine's own Python (stdlib only).

    python3 tools/gpu_install.py [--wheels dist/gpu-wheels] [--target .gpu-site]

Each pin of the folder's requirements.txt is installed from the folder's wheel for this Python
(`pip install --no-index --no-deps --target`); when the folder has none for this Python, the
install stops naming what is missing and how to make it. The run then puts the target folder
first on PYTHONPATH: its packages come before the machine's, and the machine's CUDA torch is used.

A target folder rather than a venv with --system-site-packages: on the project's GPU image python3
is itself a venv (/opt/torch/.venv), and a venv made from a venv sees the base interpreter's
packages, not that venv's torch.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def fits_this_python(wheel: Path) -> bool:
    """Whether pip would take the wheel on this interpreter (CPython on x86-64 Linux): pure, abi3 of
    an older or equal version, or built for exactly this version."""
    python_tag, abi_tag, platform_tag = wheel.stem.split("-")[-3:]
    this = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if abi_tag == "none" and platform_tag == "any":
        return any(tag.startswith("py3") for tag in python_tag.split("."))
    if abi_tag == "abi3":
        return int(python_tag[2:]) <= int(this[2:])
    return python_tag == this and abi_tag == this


def choose(wheels_dir: Path) -> tuple[list[Path], list[str]]:
    """(the wheels of requirements.txt's pins for this Python, the pins that have none)."""
    requirements = (wheels_dir / "requirements.txt").read_text().split()
    by_name: dict[str, list[Path]] = {}
    for wheel in wheels_dir.glob("*.whl"):
        by_name.setdefault(normalized(wheel.name.split("-")[0]), []).append(wheel)
    chosen, missing = [], []
    for pin in requirements:
        name, version = pin.split("==")
        fitting = [
            w
            for w in by_name.get(normalized(name), [])
            if w.name.split("-")[1] == version and fits_this_python(w)
        ]
        if fitting:
            chosen.append(fitting[0])
        else:
            missing.append(pin)
    return chosen, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=REPO / "dist" / "gpu-wheels")
    parser.add_argument("--target", type=Path, default=REPO / ".gpu-site")
    args = parser.parse_args()
    if not (args.wheels / "requirements.txt").is_file():
        raise SystemExit(
            f"{args.wheels} holds no requirements.txt: run `make gpu-wheels` where a registry is reachable"
        )
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    here = f"Python {version}"
    chosen, missing = choose(args.wheels)
    if missing:
        raise SystemExit(
            f"{args.wheels} has no wheel for {here} of {', '.join(missing)}: make the folder for it with "
            f"`make gpu-wheels GPU_PYTHONS={version}` where a registry is reachable"
        )
    shutil.rmtree(args.target, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    subprocess.run([*pip, "--target", str(args.target), *map(str, chosen)], check=True)
    print(f"installed {len(chosen)} wheels for {here} into {args.target}")


if __name__ == "__main__":
    main()
