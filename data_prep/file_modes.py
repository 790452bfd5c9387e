"""The mode of every file a run writes, for shared file systems (checkpoint.file_mode; data_prep --file-mode).

Default (no mode set): today's modes, nothing changed: our own data files 0644, files written by libraries
(DeepSpeed, TensorBoard, torch.save) as the umask says, directories 0755 under the usual umask 022.

With a mode such as 0640 or 0600: `apply` sets this process's umask to the complement of the matching directory
mode (0640 -> umask 027, 0600 -> umask 077), so that every file any library creates afterwards, in this process and
in every process it starts (the async checkpoint writer, data_prep's workers, torchrun's ranks), gets at most that
mode and every directory at most the matching mode with x bits (0640 -> 0750). Our own writers create files with the
mode itself (`data_mode`), so a group-writable mode (0660) is honoured too; `fix_tree` sets the mode on a finished
tree (a checkpoint tag before its complete.json, a reshape or export output), for files a library chmods itself
(DeepSpeed copies zero_to_fp32.py with the mode of its source) or creates with a wider mode than asked.

The mode also travels in the environment (ENV), for processes that do not inherit the umask (a Ray worker on
another node re-applies it; see data_prep.executors.ray).
"""
from __future__ import annotations

import os
import re
import stat
from typing import Optional

ENV = "RECIPES_FILE_MODE"
DEFAULT_DATA_MODE = 0o644

_mode: Optional[int] = None  # set by apply(); None = today's modes


def parse(text, field: str = "") -> int:
    """An octal file mode such as "0640" -> 0o640, or ValueError naming ``field`` and the fix. Read and write for
    the owner, no execute bits (directories get them from the read bits), no special bits, never world-writable."""
    field = f"{field}: " if field else ""
    s = str(text).strip()
    if not re.fullmatch(r"0?o?[0-7]{3}", s):
        raise ValueError(f"{field}{text!r} is not an octal file mode; write it as a quoted string such as "
                         f"\"0640\" (owner rw, group r) or \"0600\" (owner only)")
    mode = int(s.replace("o", ""), 8)
    if mode & 0o002:
        raise ValueError(f"{field}{s} lets every user write the files; use 0640, 0600 or 0660 (group-writable)")
    if mode & 0o111:
        raise ValueError(f"{field}{s} has execute bits; give the file mode (0640), directories get x where r is")
    if mode & 0o600 != 0o600:
        raise ValueError(f"{field}{s} does not let the owner read and write the files the run rereads "
                         "(checkpoints, shards); use 0600 or wider, e.g. 0640")
    return mode


def dir_mode(mode: int) -> int:
    """The directory mode matching a file mode: x wherever r (0640 -> 0750, 0600 -> 0700)."""
    return mode | ((mode & 0o444) >> 2)


def apply(mode: Optional[int]) -> None:
    """Make ``mode`` the mode of everything this process and its children write from now on (see the module doc).
    None leaves today's modes."""
    global _mode
    if mode is None:
        return
    _mode = mode
    os.umask(0o777 & ~dir_mode(mode))
    os.environ[ENV] = f"{mode:04o}"


def current() -> Optional[int]:
    """The mode set in this process or inherited from its parent (ENV); None = today's modes."""
    if _mode is None and os.environ.get(ENV):
        apply(parse(os.environ[ENV], ENV))
    return _mode


def data_mode() -> int:
    """The mode our own writers create data files with (shards, indexes, manifests, checkpoint files, logs)."""
    mode = current()
    return DEFAULT_DATA_MODE if mode is None else mode


def fix_tree(path, mode: Optional[int] = None) -> None:
    """Set the mode on every file and directory under ``path`` (and ``path``): files ``mode`` (with x bits where the
    owner had x: a script stays runnable), directories ``dir_mode``. A no-op without a mode; symlinks are left alone
    (never followed)."""
    mode = current() if mode is None else mode
    if mode is None or not os.path.lexists(path):
        return
    _fix_one(str(path), mode)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            _fix_one(os.path.join(root, name), mode)


def fix_dir_files(path, mode: Optional[int] = None) -> None:
    """``fix_tree`` of a directory and the plain files directly in it, not of its subdirectories (a checkpoint.dir:
    DeepSpeed's recovery scripts beside the tags, without walking every tag again)."""
    mode = current() if mode is None else mode
    if mode is None or not os.path.isdir(path):
        return
    _fix_one(str(path), mode)
    with os.scandir(path) as entries:
        for e in entries:
            if e.is_file(follow_symlinks=False):
                _fix_one(e.path, mode)


def _fix_one(p: str, mode: int) -> None:
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        return
    want = dir_mode(mode) if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR else mode
    if stat.S_ISDIR(st.st_mode):
        want |= st.st_mode & stat.S_ISGID  # a project directory's setgid (new files get its group) is kept
    if stat.S_IMODE(st.st_mode) != want:
        os.chmod(p, want)
