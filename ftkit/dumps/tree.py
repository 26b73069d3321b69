"""Which files of a tree are read: regular files only, symlinks kept inside the tree.

``TreeWalker(root, follow_symlinks)`` lists the non-hidden regular files of a tree by suffix
(``files``), records special files (FIFOs, sockets, devices) in ``skipped`` instead of opening
them, and refuses (``InputError``) a symlink whose target lies outside ``root`` unless
``follow_symlinks``, as well as broken or looping symlinks. Symlinks are guarded at every
level: a symlinked directory is never followed, and one whose target lies outside ``root``
(a run's ``dumps/`` linked to another run's, a rollout directory linked elsewhere) is refused
(``InputError``) with or without ``follow_symlinks``, since reading it would compare a tree
with itself; ``subdir`` applies the same guard to a directory a caller enters by name.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ftkit.errors import InputError


class TreeWalker:
    """Lists the regular files of a tree; records special files; guards symlinks."""

    def __init__(self, root: Path, follow_symlinks: bool) -> None:
        self.root, self.follow = root, follow_symlinks
        self.real_root = root.resolve()
        self.skipped: list[str] = []

    def files(self, top: Path, suffix: str, skip: tuple[Path, ...] = ()) -> list[str]:
        """Relative paths (posix, to ``top``) of non-hidden regular files ending in ``suffix``;
        the directories in ``skip`` are not entered."""
        found = []
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            d = Path(dirpath)
            dirnames[:] = sorted(
                n for n in dirnames if not n.startswith(".") and d / n not in skip and not self._linked_dir(d / n)
            )
            for n in filenames:
                if n.endswith(suffix) and not n.startswith(".") and self.check(d / n):
                    found.append((d / n).relative_to(top).as_posix())
        return sorted(found)

    def subdir(self, path: Path) -> bool:
        """True when ``path`` is a directory to enter: False when absent, not a directory, or a
        symlink kept inside the tree (not followed); ``InputError`` for a symlink leaving it."""
        if not os.path.lexists(path):
            return False
        return not self._linked_dir(path) and path.is_dir()

    def _linked_dir(self, path: Path) -> bool:
        """True for a symlinked directory inside the tree (not followed); ``InputError`` for one
        whose target lies outside it (never followed, whatever ``follow_symlinks``)."""
        if not path.is_symlink():
            return False
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError) as exc:
            raise InputError(f"{path} is a broken or looping symlink", "remove it or fix its target") from exc
        if not target.is_relative_to(self.real_root):
            raise InputError(
                f"{path} is a symlinked directory pointing to {target}, outside {self.root}",
                "symlinked directories are never followed (the two sides could be one tree); "
                "copy the directory into the tree",
            )
        return True

    def check(self, path: Path) -> bool:
        """True for a regular file (through an allowed symlink); False for a special file
        (recorded); ``InputError`` for a symlink leaving the tree or a dangling one."""
        if path.is_symlink():
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError) as exc:
                raise InputError(f"{path} is a broken or looping symlink", "remove it or fix its target") from exc
            if not self.follow and not target.is_relative_to(self.real_root):
                raise InputError(
                    f"{path} is a symlink to {target}, outside {self.root}",
                    "copy the file into the tree, or pass --follow-symlinks to read it anyway",
                )
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror or exc}", "check the path and permissions") from exc
        if stat.S_ISREG(mode):
            return True
        self.skipped.append(str(path))
        return False
