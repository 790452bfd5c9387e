"""Helpers of prepare.sh / run.sh that are easier in Python than in bash (standard library only, any Python 3.9+).

    offline.py check-tags WHEEL_DIR [--python 3.12]   every wheel installs on CPython 3.12 manylinux x86_64
    offline.py install WHEEL... --target DIR          unpack wheels (for an interpreter without pip)
    offline.py torch-view VIEW_DIR                    symlink torch + its own requirements from this interpreter's
                                                      site-packages into VIEW_DIR: "an image with only torch"
    offline.py twins WHEEL_DIR                        name==version of the wheels built for one CPython ABI
    offline.py size WHEEL_DIR [--limit-mib 64]        list the wheels and their total; exit 1 over the limit
"""
from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

# manylinux policies a glibc-2.28+ x86_64 image accepts (PEP 600 names and their legacy aliases)
_PLATFORMS = {"any", "linux_x86_64"} | {f"manylinux_2_{m}_x86_64" for m in range(5, 29)} | {
    "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"}


def wheel_tags(name: str) -> set[tuple[str, str, str]]:
    """{(python, abi, platform)} of a wheel file name (PEP 427; compressed tag sets expanded)."""
    parts = name[:-4].split("-")
    py, abi, plat = parts[-3:]
    return {(p, a, pl) for p in py.split(".") for a in abi.split(".") for pl in plat.split(".")}


def installs_on(name: str, version: tuple[int, int]) -> bool:
    """Would pip on CPython `version`, manylinux x86_64 (glibc 2.28), accept this wheel?"""
    cp = f"cp{version[0]}{version[1]}"
    for py, abi, plat in wheel_tags(name):
        if plat not in _PLATFORMS:
            continue
        if abi == "none" and (py in ("py3", f"py{version[0]}{version[1]}", cp)):
            return True
        if abi == cp and py == cp:
            return True
        m = re.fullmatch(r"cp3(\d+)", py)
        if abi == "abi3" and m and int(m.group(1)) <= version[1]:
            return True
    return False


def check_tags(wheel_dir: Path, version: tuple[int, int]) -> int:
    wheels = sorted(wheel_dir.glob("*.whl"))
    bad = [w.name for w in wheels if not installs_on(w.name, version)]
    if not wheels:
        print(f"error: no wheels in {wheel_dir}; run launch/gpu_check/prepare.sh first", file=sys.stderr)
        return 1
    if bad:
        print(f"error: these wheels do not install on CPython {version[0]}.{version[1]} manylinux x86_64: "
              f"{', '.join(bad)}; rerun launch/gpu_check/prepare.sh", file=sys.stderr)
        return 1
    print(f"{len(wheels)} wheels install on CPython {version[0]}.{version[1]} manylinux x86_64")
    return 0


def unpack(wheels: list[Path], target: Path) -> None:
    """What `pip install --no-deps --target` does for wheels without scripts: unpack, .data/purelib|platlib merged."""
    target.mkdir(parents=True, exist_ok=True)
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            for info in z.infolist():
                parts = info.filename.split("/")
                if len(parts) > 2 and parts[0].endswith(".data"):
                    if parts[1] not in ("purelib", "platlib"):
                        continue  # scripts / headers: not needed to import
                    parts = parts[2:]
                dest = target.joinpath(*parts)
                if info.is_dir():
                    dest.mkdir(parents=True, exist_ok=True)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(z.read(info))
                if (info.external_attr >> 16) & 0o111:
                    dest.chmod(0o755)


def torch_view(view: Path) -> list[str]:
    """Symlink torch and the distributions it requires (recursively, markers evaluated here) into `view`."""
    from importlib.metadata import distribution

    from packaging.requirements import Requirement

    view.mkdir(parents=True, exist_ok=True)
    todo, done = ["torch"], {}
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in done:
            continue
        try:
            dist = distribution(name)
        except Exception:
            continue  # optional on this platform (e.g. triton, nvidia-* on a CPU build)
        done[key] = dist
        for req in dist.requires or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    for dist in done.values():
        root = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src, dst = root / top, view / top
            if src.exists() and not dst.exists() and top != "__pycache__":
                dst.symlink_to(src)
    return sorted(done)


def report_size(wheel_dir: Path, limit_mib: float) -> int:
    wheels = sorted(wheel_dir.glob("*.whl"))
    for w in wheels:
        print(f"{w.stat().st_size:>10}  {w.name}")
    total = sum(w.stat().st_size for w in wheels)
    print(f"total: {total} bytes ({total / 2**20:.1f} MiB) in {len(wheels)} wheels; limit {limit_mib:g} MiB")
    if total > limit_mib * 2**20:
        print(f"error: {wheel_dir} holds {total / 2**20:.1f} MiB, over the {limit_mib:g} MiB that can travel with the "
              "repository; drop a wheel from launch/gpu_check/wheels.txt that the GPU image already has",
              file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-tags")
    c.add_argument("wheel_dir", type=Path)
    c.add_argument("--python", default="3.12")
    i = sub.add_parser("install")
    i.add_argument("wheels", nargs="+", type=Path)
    i.add_argument("--target", type=Path, required=True)
    v = sub.add_parser("torch-view")
    v.add_argument("view", type=Path)
    t = sub.add_parser("twins")
    t.add_argument("wheel_dir", type=Path)
    z = sub.add_parser("size")
    z.add_argument("wheel_dir", type=Path)
    z.add_argument("--limit-mib", type=float, default=64)
    ns = ap.parse_args(argv)
    if ns.cmd == "size":
        return report_size(ns.wheel_dir, ns.limit_mib)
    if ns.cmd == "check-tags":
        major, minor = (int(x) for x in ns.python.split("."))
        return check_tags(ns.wheel_dir, (major, minor))
    if ns.cmd == "install":
        unpack(ns.wheels, ns.target)
        return 0
    if ns.cmd == "torch-view":
        print(" ".join(torch_view(ns.view)))
        return 0
    for w in sorted(ns.wheel_dir.glob("*.whl")):  # twins: the wheels tied to one CPython ABI (cpXY-cpXY)
        if any(abi.startswith("cp3") and abi != "abi3" for _, abi, _ in wheel_tags(w.name)):
            name, version = w.name.split("-")[:2]
            print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
