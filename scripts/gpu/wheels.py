"""The carried wheels: trim nvidia-pytriton to one Python (here), install without pip (there).

    python scripts/gpu/wheels.py trim WHEEL --python 3.12 --out DIR
        nvidia-pytriton's wheel carries a python backend stub for every Python from 3.8 to
        3.13 and a bundled libpython 3.13 for the 3.13 stub: 55 MB, too much to carry beside
        numpy 1.26 (which the stub needs: it was built with pybind11 2.10, for numpy < 2).
        Keeps the stub for --python and every library some kept binary needs (readelf),
        drops the rest, recompresses with LZMA (pip's zipfile reads it) and rewrites RECORD:
        DIR/nvidia_pytriton-<version>-0trimmed-<tags>.whl, the same files for that Python.
    python scripts/gpu/wheels.py install WHEEL... --site DIR
        For a Python without pip: unpacks each wheel into DIR (a venv's site-packages),
        keeping executable bits. pip, when present, is the better tool (run.sh prefers it).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

STUBS = re.compile(r"python_backend_stubs/(\d+\.\d+)/")


def _needed(path: Path) -> set[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True)
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out.stdout))


def _is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


def trim(wheel: Path, python: str, out: Path) -> Path:
    source = zipfile.ZipFile(wheel)
    infos = [i for i in source.infolist()
             if not (STUBS.search(i.filename) and STUBS.search(i.filename).group(1) != python)]
    if not any(STUBS.search(i.filename) for i in infos):
        raise SystemExit(f"{wheel.name} has no python backend stub for Python {python}")
    libs = {Path(i.filename).name: i for i in infos if "nvidia_pytriton.libs/" in i.filename and not i.is_dir()}
    with tempfile.TemporaryDirectory() as tmp:
        # Every ELF outside the bundled libs is a root (the server, backends, caches, the stub);
        # keep the bundled libs they need, transitively.
        needed: set[str] = set()
        todo = []
        for info in infos:
            if "nvidia_pytriton.libs/" not in info.filename and _is_elf(source.read(info.filename)[:4]):
                todo.append(info)
        seen: set[str] = set()
        while todo:
            info = todo.pop()
            if info.filename in seen:
                continue
            seen.add(info.filename)
            path = Path(tmp) / Path(info.filename).name
            path.write_bytes(source.read(info.filename))
            for lib in _needed(path) - needed:
                needed.add(lib)
                if lib in libs:
                    todo.append(libs[lib])
        dropped = sorted(name for name in libs if name not in needed)
    keep = [i for i in infos if not ("nvidia_pytriton.libs/" in i.filename and Path(i.filename).name in dropped)]
    name_parts = wheel.name[:-len(".whl")].split("-")  # name, version, [build], python, abi, platform
    target = out / ("-".join([name_parts[0], name_parts[1], "0trimmed", *name_parts[-3:]]) + ".whl")
    out.mkdir(parents=True, exist_ok=True)
    kept_names = {i.filename for i in keep}
    with zipfile.ZipFile(target, "w", zipfile.ZIP_LZMA) as dst:
        for info in keep:
            data = source.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [ln for ln in data.decode().splitlines() if ln.split(",")[0] in kept_names]
                data = ("\n".join(lines) + "\n").encode()
            clone = zipfile.ZipInfo(info.filename, info.date_time)
            clone.external_attr, clone.create_system = info.external_attr, info.create_system
            clone.compress_type = zipfile.ZIP_LZMA
            dst.writestr(clone, data)
    gone = sorted({i.filename for i in source.infolist()} - kept_names)
    print(f"{target.name}: kept {len(keep)} files for Python {python}, dropped {len(gone)}: "
          f"{', '.join(sorted({STUBS.search(g).group(1) for g in gone if STUBS.search(g)}))} stubs and "
          f"{', '.join(dropped) or 'no library'}; {wheel.stat().st_size / 1e6:.1f} -> "
          f"{target.stat().st_size / 1e6:.1f} MB")
    return target


def install(wheels: list[Path], site: Path) -> None:
    """Unpack into site-packages: the wheel's root, and its .data/purelib|platlib folders."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if info.is_dir():
                    continue
                parts = Path(info.filename).parts
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue  # scripts, headers, data: not needed to import the package
                    rel = Path(*parts[2:])
                else:
                    rel = Path(info.filename)
                dest = site / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(z.read(info.filename))
                mode = (info.external_attr >> 16) & 0o777
                if mode & 0o111:
                    dest.chmod(0o755)
        print(f"unpacked {wheel.name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu/wheels.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trim")
    t.add_argument("wheel", type=Path)
    t.add_argument("--python", required=True, help="e.g. 3.12")
    t.add_argument("--out", type=Path, required=True)
    i = sub.add_parser("install")
    i.add_argument("wheels", type=Path, nargs="+")
    i.add_argument("--site", type=Path, required=True)
    args = p.parse_args(argv)
    if args.command == "trim":
        trim(args.wheel, args.python, args.out)
    else:
        install(args.wheels, args.site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
