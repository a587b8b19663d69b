"""What a GPU evidence call carries, prepared on a CPU (``bash bench/gpu_evidence.sh prepare``, see
``bench/gpu_evidence.py``): ``ncars-dev`` packed as ``.evz`` files into one uncompressed zip, and the wheels the GPU
image lacks, in the git-ignored ``.gpu/``; their sizes, tracked code included, against what a call may carry."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / ".gpu"
DATA_ZIP, WHEELS_DIR, PACK_INFO = "ncars-dev.zip", "wheels", "pack.json"
CARRY_LIMIT = 60 * 2**20  # what the call may carry, tracked code included (the device tool's limit is 64 MiB)
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "timm")  # not on the GPU image
DEVICE_PYTHON = "3.12"  # the GPU image's python3
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
SPLITS = ("train", "test")
# the splits that choose, best first: the first the data has is packed, each other one when the call can carry it
# (ncars-dev's val-apart, recorded apart from training, leaves no room for val: val is left out)
CHOOSING_SPLITS = ("val-apart", "val")
ZIP_ENTRY_BYTES = 2 * 100  # a stored member's local header and central directory entry, with its name


def log(message: str) -> None:
    print(f"[gpu-evidence {time.strftime('%H:%M:%S')}] {message}", flush=True)


def prepare(src: Path, dst: Path = PACK, files_per_class: dict[str, int] | None = None, wheels: bool = True) -> dict:
    """Pack ``src`` (an N-Cars folder with ``train/``, ``test/`` and ``val-apart/`` or ``val/``) into
    ``dst/DATA_ZIP`` and the GPU machine's missing wheels into ``dst/WHEELS_DIR``: ``SPLITS`` and the first of
    ``CHOOSING_SPLITS`` ``src`` has; each other one joins the zip when the call still carries at most
    ``CARRY_LIMIT`` with it, else it is left out and named. Returns what ``PACK_INFO`` records (files, events,
    bytes, per split, left out)."""
    from mem_core.io.pack import pack_folder

    choosing = [split for split in CHOOSING_SPLITS if (src / split).is_dir()]
    missing = [f"{split}/" for split in SPLITS if not (src / split).is_dir()] + ([] if choosing else ["val/"])
    if missing:
        raise SystemExit(f"{src}: no {', '.join(missing)} folder: give an ncars-dev-like folder")
    dst.mkdir(parents=True, exist_ok=True)
    if wheels:
        download_wheels(dst / WHEELS_DIR)
    (dst / DATA_ZIP).unlink(missing_ok=True)
    room = CARRY_LIMIT - sum(carried_bytes(dst).values())
    per_split: dict[str, dict[str, int]] = {}
    left_out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-evidence-") as tmp:
        source = _subset(src, Path(tmp) / "subset", files_per_class) if files_per_class else src
        with zipfile.ZipFile(dst / DATA_ZIP, "w", zipfile.ZIP_STORED) as archive:  # .evz is compressed already
            for split in (*SPLITS, *(s for s in CHOOSING_SPLITS if (source / s).is_dir())):
                packed = Path(tmp) / "packed" / split
                report = pack_folder(source / split, packed, progress=lambda m, s=split: log(f"{s}: {m}"))
                if report.skipped:
                    raise SystemExit(f"{src}: {len(report.skipped)} file(s) did not pack, e.g. {report.skipped[0]}")
                size = report.packed_bytes + ZIP_ENTRY_BYTES * report.packed
                optional = split in CHOOSING_SPLITS and split != choosing[0]
                if optional and sum(v["bytes"] for v in per_split.values()) + size > room:
                    left_out.append(split)
                    log(f"{split}/ left out: with it the call would carry more than {CARRY_LIMIT / 2**20:.0f} MiB")
                    continue
                for path in sorted(p for p in packed.rglob("*") if p.is_file()):
                    archive.write(path, f"{split}/{path.relative_to(packed).as_posix()}")
                per_split[split] = {"files": report.packed, "events": report.events, "bytes": size}
    files, events = (sum(v[k] for v in per_split.values()) for k in ("files", "events"))
    info = {
        "source": str(src),
        "files": files,
        "events": events,
        "mean_events": events / max(files, 1),
        "packed_bytes": (dst / DATA_ZIP).stat().st_size,
        "per_split": {split: v["files"] for split, v in per_split.items()},
        "left_out": left_out,
    }
    (dst / PACK_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


def packed_list(archive: Path, split: str) -> list[str]:
    """The ``.evz`` members of ``split`` in the zip ``archive``."""
    with zipfile.ZipFile(archive) as zf:
        return [n for n in zf.namelist() if n.startswith(f"{split}/") and n.endswith(".evz")]


def _subset(src: Path, dst: Path, files_per_class: dict[str, int]) -> Path:
    """A copy of the first files of every class folder of every split of ``src`` (the smoke's few files)."""
    from mem_core.datasets.base import sorted_files
    from mem_core.io.registry import extensions

    for split, count in files_per_class.items():
        if not (src / split).is_dir():
            continue
        for folder in sorted(p for p in (src / split).iterdir() if p.is_dir()):
            (dst / split / folder.name).mkdir(parents=True)
            for path in sorted_files(folder, tuple(extensions()))[:count]:
                shutil.copy(path, dst / split / folder.name / path.name)
    return dst


def download_wheels(folder: Path) -> list[Path]:
    """The wheels of ``WHEELS`` at this environment's versions, for the GPU image's Python and platform."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    # uv's environments have no pip of their own: uvx runs pip from the package index's wheel
    pip = [sys.executable, "-m", "pip"] if _has_pip(sys.executable) else ["uvx", "pip"]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    for name in WHEELS:
        spec = f"{name}=={importlib.metadata.version(name)}"
        command = [*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", DEVICE_PYTHON]
        command += ["--implementation", "cp", *platforms, "--dest", str(folder), spec]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"pip download {spec} failed: {done.stderr.strip().splitlines()[-1:]}")
    return sorted(folder.glob("*.whl"))


def _has_pip(python: str) -> bool:
    return subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0


def carried_bytes(folder: Path = PACK) -> dict[str, int]:
    """Bytes the call carries: the tracked code and each part of ``folder``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    tracked = sum((ROOT / name).stat().st_size for name in listed.decode().split("\0") if (ROOT / name).is_file())
    sizes = {"tracked code": tracked}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        part = "wheels" if path.parent.name == WHEELS_DIR else path.name
        sizes[part] = sizes.get(part, 0) + path.stat().st_size
    return sizes


def print_sizes(sizes: dict[str, int]) -> int:
    """Print what the call carries against ``CARRY_LIMIT``; returns the total."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"what the device call carries (limit {CARRY_LIMIT / 2**20:.0f} MiB)")
    table.add_column("part")
    table.add_column("MiB", justify="right")
    for part, size in sizes.items():
        table.add_row(part, f"{size / 2**20:.2f}")
    total = sum(sizes.values())
    table.add_row("[bold]total", f"[bold]{total / 2**20:.2f}")
    Console().print(table)
    return total
