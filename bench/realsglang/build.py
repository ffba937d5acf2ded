"""Build what one device call carries to run real SGLang 0.5.17 on the lent H200.

    python bench/realsglang/build.py            # -> .device/realsglang/site.tar.xz (about 50 MB)

The H200 machine has Python 3.12, torch 2.11.0+cu130 and triton 3.6.0 of its own and reaches no
package index, so the rest travels: the cp312 wheels in `wheels.txt`, downloaded here once into
`.whl/realsglang/` (ignored by git), installed with --no-deps into one directory that goes at the
front of PYTHONPATH there. Three things keep it inside a call's 64 MiB:

- sglang-kernel 0.4.5 is 383 MB as a wheel, mostly FlashAttention 3 (`flash_ops`) and the sm100
  build; the H200 (sm_90) needs the Python files and `sgl_kernel/sm90/common_ops.abi3.so`.
- xgrammar's static libraries, sglang's `multimodal_gen` and the test folders are not used by a
  text server.
- two module-level imports the server never uses get stubs: `IPython.display` (sglang/utils.py)
  and `soundfile` (audio paths).

The project itself is not in the archive: the working tree travels with every call, and
`run.py` builds the plugin wheel from it on the machine (`ddtree_ops.wheel.build`), so a fix made
between two calls is what runs in the second.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WHEELS = REPO / ".whl" / "realsglang"
OUT = REPO / ".device" / "realsglang"
PLATFORMS = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64",
             "manylinux_2_5_x86_64", "any"]
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
          *[a for p in PLATFORMS for a in ("--platform", p)]]

# relative to the site directory: what the server never loads on an H200
PRUNE = ["sgl_kernel/flash_ops*", "sgl_kernel/sm100", "sgl_kernel/*infllm_ops*", "sgl_kernel/*flashmla_ops*",
         "sglang/multimodal_gen", "sglang/test", "xgrammar/lib/*.a", "*/tests", "bin"]

STUBS = {
    "IPython/__init__.py": '"""Stub: sglang/utils.py imports IPython.display at module level; the server never shows HTML."""\n',
    "IPython/display.py": "def display(*args, **kwargs):\n    pass\n\n\nclass HTML(str):\n    pass\n",
    "soundfile.py": '"""Stub: audio paths import soundfile at module level; a text server never reads audio."""\n',
}


def requirements() -> list[str]:
    return [ln.split("#")[0].strip() for ln in (HERE / "wheels.txt").read_text().splitlines()
            if ln.split("#")[0].strip()]


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True)


def download() -> list[Path]:
    WHEELS.mkdir(parents=True, exist_ok=True)
    reqs = requirements()
    pip("download", "--no-deps", *TARGET, "-d", str(WHEELS), *reqs)
    wheels = sorted(WHEELS.glob("*.whl"))
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    missing = [r for r in reqs if r.split("==")[0].lower().replace("_", "-") not in names]
    if missing:
        raise SystemExit(f"wheels missing after download: {missing}")
    return wheels


def install(wheels: list[Path], site: Path) -> None:
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    pip("install", "--no-deps", "--no-compile", "--no-index", "--target", str(site), *TARGET, *map(str, wheels))
    for pattern in PRUNE:
        for path in site.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for rel, text in STUBS.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    kernel = site / "sgl_kernel" / "sm90" / "common_ops.abi3.so"
    if not kernel.exists():
        raise SystemExit(f"{kernel} is missing: the slimmed sglang-kernel would not import on sm_90")


def pack(site: Path, archive: Path) -> None:
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        tar.add(site, arcname="site")
    tmp.replace(archive)        # never a half-written archive under the real name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    t0 = time.monotonic()
    wheels = download()
    site = OUT / "build" / "site"
    install(wheels, site)
    OUT.mkdir(parents=True, exist_ok=True)
    archive = OUT / "site.tar.xz"
    pack(site, archive)
    unpacked = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    print(f"{archive.relative_to(REPO)}: {archive.stat().st_size / 2**20:.1f} MiB "
          f"({unpacked / 2**20:.0f} MiB unpacked, {len(wheels)} wheels) in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
