"""Shrinks an unpacked NIXL wheel (nixl_cu12 / nixl_cu13) to what the UCX backend needs, so it fits
the GPU machine's 64 MiB carry: keeps the Python package, the core libraries, the UCX plugin and
UCX's modules, and every bundled library those need (by their ELF NEEDED entries); drops the EP
kernels, the other plugins (object stores, GDS, libfabric, ...) and the libraries only they use.
NIXL logs and skips plugins it cannot find.

    python deploy/gpu-check/prune_nixl.py DIR nixl_cu13    # DIR: where the wheel was unzipped
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def needed(lib: Path) -> set[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line}


def prune(root: Path, name: str) -> list[Path]:
    """Removes what the UCX backend does not need under `root`; returns what it removed."""
    core, bundled = root / f".{name}.mesonpy.libs", root / f"{name}.libs"
    removed = [p for p in (root / name.replace("nixl_", "nixl_ep_"),) if p.exists()]
    plugin_dirs = (core / "plugins", bundled / "nixl")  # where each NIXL release puts them
    removed += [p for d in plugin_dirs for p in d.glob("*.so") if p.name != "libplugin_UCX.so"]
    removed += list((bundled / "ucx").glob("libucx_perftest*"))
    for path in removed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    roots = [
        *root.joinpath(name).glob("*.so"), *core.glob("*.so*"),
        *(p for d in plugin_dirs for p in d.glob("*.so")), *(bundled / "ucx").glob("*.so*")
    ]
    by_name = {p.name: p for p in bundled.glob("*.so*")} | {p.name: p for p in core.glob("*.so*")}
    keep, todo = set(), list(roots)
    while todo:
        for dep in needed(todo.pop()):
            if dep in by_name and dep not in keep:
                keep.add(dep)
                todo.append(by_name[dep])
    dropped = [p for p in bundled.glob("*.so*") if p.name not in keep]
    for path in dropped:
        path.unlink()
    return removed + dropped


if __name__ == "__main__":
    gone = prune(Path(sys.argv[1]), sys.argv[2])
    print(f"removed {len(gone)} entries: " + ", ".join(sorted(p.name for p in gone)))
