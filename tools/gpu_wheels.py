"""Everything `make bench-gpu` needs on a GPU machine that reaches no registry, beside torch (`make gpu-wheels`).

    .venv/bin/python tools/gpu_wheels.py [--out dist/gpu-wheels] [--pythons 3.12]

The GPU machine has Python and a CUDA build of PyTorch; the rest travels with the repository as
this folder, carried beside the working tree, which together may hold at most 64 MiB. It holds:

- rollflow itself, one wheel per Python version, its compiled core (`EXTENSIONS`) built here with gcc for that version, each wheel checked
  to load it with that interpreter. Built here rather than there from the sdist: a machine with a
  pip-installed PyTorch often has no Python headers (python3-dev) and nothing to build with offline
  (setuptools). Each version's interpreter is found among pyenv's versions or on PATH (python3.X).
- the runtime dependencies the run imports, torch excepted (the machine's own CUDA build is used),
  at exactly the versions installed in the interpreter running this script (those the tests ran
  with), downloaded without their dependencies (`pip download --no-deps`): binary wheels for each
  version, pure-Python and abi3 ones once.
- requirements.txt: the exact pins, which tools/gpu_install.py installs.
- vidur/: the two files of Vidur's public data the run reads (the H100 Llama-2-7B table and the
  Splitwise conversation trace) with Vidur's README and licence, 1.1 MB: ../shared beside a
  checkout does not travel to the GPU machine.

Left out because the run does not import them (checked by running it from these wheels alone in a
Python that has only torch): matplotlib and pillow (the simulator's figures; the run draws none),
zstandard (weight pulls), hf-xet, typer, click, pygments, fsspec, ray, gymnasium, tensorboard
(`rollflow train` writes metrics.csv without it), the docs and dev tools.

One Python version's set is 48 MiB, two are 76 (numpy alone is 16 MiB a version), over the limit
beside the 3 MiB working tree: the default is 3.12, the Python of the project's GPU image (3.12.3,
/opt/torch/.venv); `--pythons 3.11` (or 3.13) makes another machine's set. rollflow needs Python
3.11 or newer (pyproject.toml): there is no 3.10 set. The script fails when the folder and the
working tree together are over 64 MiB.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_BYTES = 64 << 20
# Distributions the GPU run imports (benchmarks/gpu and the rollflow commands it starts), torch's own
# requirements included where the run needs a newer one than an older torch may bring.
RUNTIME = (
    "numpy", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
    "pyyaml", "rich", "orjson", "xxhash", "uvloop", "prometheus-client", "aiohttp", "aiohappyeyeballs",
    "aiosignal", "attrs", "frozenlist", "multidict", "propcache", "yarl", "idna", "transformers", "tokenizers",
    "safetensors", "huggingface-hub", "regex", "tqdm", "packaging", "filelock", "httpx2", "httpcore2", "h11",
    "anyio", "truststore",
)  # fmt: skip
VIDUR_FILES = (
    "README.md",
    "LICENSE",
    "profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
    "processed_traces/splitwise_conv.csv",
)
# manylinux tags a GPU machine's glibc (2.28 or newer: Ubuntu 20.04 has 2.31) accepts
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
EXTENSIONS = (
    "rollflow/perf/_timing",
    "rollflow/sim/_loop",
    "rollflow/sim/_trace",
    "rollflow/runtime/engines/_chunked",
    "rollflow/runtime/engines/_trim",
)


def interpreter(version: str) -> str:
    """The python3.X to build rollflow's wheel for version X with: pyenv's, else one on PATH (not a
    pyenv shim, which fails for a version that is not selected)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for candidate in sorted(pyenv.glob(f"{version}.*/bin/python{version}"), reverse=True):
        return str(candidate)
    found = shutil.which(f"python{version}")
    if found and "/shims/" not in found:
        return found
    raise SystemExit(
        f"no Python {version} here to build rollflow's wheel with: install it (pyenv install {version})"
    )


def worktree_files() -> list[str]:
    """The working tree's files that git tracks or would (no build outputs, no .so built for 3.11):
    what a wheel is built from, and what travels to the GPU machine beside the carried folder."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


def source_tree(into: Path) -> Path:
    for name in worktree_files():
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, into / name)
    return into


def build_rollflow(version: str, source: Path, out: Path) -> Path:
    """rollflow's wheel for `version`, checked to hold and load its compiled core."""
    python = interpreter(version)
    before = set(out.glob("rollflow-*.whl"))
    subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)], check=True)
    (wheel,) = set(out.glob("rollflow-*.whl")) - before
    tag = f"cp{version.replace('.', '')}"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for extension in EXTENSIONS:
            if not any(n.startswith(f"{extension}.cpython-{tag[2:]}") and n.endswith(".so") for n in names):
                raise SystemExit(
                    f"{wheel.name} lacks its compiled {extension} (did gcc fail? see the build output)"
                )
        with tempfile.TemporaryDirectory() as unpacked:
            archive.extractall(unpacked)
            check = "import " + ", ".join(path.replace("/", ".") for path in EXTENSIONS)
            subprocess.run(
                [python, "-I", "-c", f"import sys; sys.path.insert(0, {unpacked!r}); {check}"], check=True
            )
    return wheel


def download(version: str, out: Path) -> None:
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in RUNTIME]
    tag = version.replace(".", "")
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(out)]
    argv += ["--python-version", version, "--implementation", "cp", "--abi", f"cp{tag}"]
    argv += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([*argv, *pins], check=True)


def copy_vidur(vidur_data: Path, out: Path) -> None:
    for name in VIDUR_FILES:
        if not (vidur_data / name).is_file():
            raise SystemExit(f"Vidur's {name} is not in {vidur_data} (give --vidur-data)")
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(vidur_data / name, out / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist" / "gpu-wheels")
    parser.add_argument("--pythons", default="3.12", help="comma-separated Python versions (default 3.12)")
    parser.add_argument(
        "--vidur-data",
        type=Path,
        default=next((p for p in (REPO / "shared", REPO.parent / "shared") if p.is_dir()), REPO / "shared")
        / "data"
        / "vidur",
        help="Vidur's data folder (default: shared/data/vidur in or beside the repository)",
    )
    args = parser.parse_args()
    versions = args.pythons.split(",")
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    copy_vidur(args.vidur_data, args.out / "vidur")
    with tempfile.TemporaryDirectory(prefix="rollflow-source-") as tmp:
        source = source_tree(Path(tmp))
        for version in versions:
            print(
                f"rollflow for Python {version}: {build_rollflow(version, source, args.out).name}", flush=True
            )
    for version in versions:
        download(version, args.out)
    pins = ["rollflow==" + importlib.metadata.version("rollflow")]
    pins += [f"{name}=={importlib.metadata.version(name)}" for name in RUNTIME]
    (args.out / "requirements.txt").write_text("\n".join(pins) + "\n")
    wheels = sorted(args.out.glob("*.whl"))
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    tree = sum((REPO / name).stat().st_size for name in worktree_files())
    print(
        f"{len(wheels)} wheels for Python {', '.join(versions)} and Vidur's two files in {args.out}: "
        f"{size / 2**20:.1f} MiB; with the working tree ({tree / 2**20:.1f} MiB) {(size + tree) / 2**20:.1f} "
        f"of the {MAX_BYTES / 2**20:.0f} MiB that may travel"
    )
    if size + tree > MAX_BYTES:
        for wheel in sorted(wheels, key=lambda w: -w.stat().st_size)[:10]:
            print(f"  {wheel.stat().st_size / 2**20:6.1f} MiB  {wheel.name}")
        raise SystemExit(
            f"{args.out} and the working tree are {(size + tree) / 2**20:.1f} MiB, over the 64 MiB that may travel"
        )


if __name__ == "__main__":
    main()
