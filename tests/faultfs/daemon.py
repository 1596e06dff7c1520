"""The power-loss filesystem's process: ``python daemon.py DISK ORPHANS MOUNTPOINT``.

A FUSE passthrough over ``DISK`` that holds, as LazyFS does, everything not yet made durable
apart from what was: ``DISK`` is the disk as it would be found after a power loss at any
moment, and the view at ``MOUNTPOINT`` is what the programs running on it see.

- File data and sizes: a write or truncation stays in this process's memory (whole 4 KiB
  blocks) until ``fsync``/``fdatasync`` of that file writes them into its file under
  ``DISK``.
- Names: a create, unlink, rename, mkdir or rmdir stays in an ordered journal until an
  ``fsync`` of a directory commits every change made before it to ``DISK``, in order, as a
  journaling filesystem's commit does. A file's own ``fsync`` does not make its name durable
  (POSIX asks for the directory's). The data of a file whose name is not durable yet lives in
  ``ORPHANS``, which the next mount empties, as a filesystem check frees orphan inodes.

It reads commands on its standard input, one a line, and answers each with one JSON line:

- ``cut KEEP SEED``: the power goes. From here every operation fails with EIO, so nothing
  written after the cut lands; first, each unsynced block (and truncation) reaches ``DISK``
  with probability ``KEEP`` and a random prefix of the name journal is committed when
  ``KEEP`` > 0 (the disk had written some of it back, in any order for data, in order for
  the journal); ``KEEP`` 0 drops it all (LazyFS's behaviour). The answer counts what was
  dropped.
- ``arm NAME NTH KEEP SEED``: the same cut, during the NTH write to the file NAME from now
  on (that write fails): a cut at an exact point, say inside a checkpoint.
- ``stats``: file and directory syncs so far, unsynced blocks and journal entries now, and
  what the cut did once there was one.

Shared writable ``mmap`` (SQLite's ``-shm``) works: files are opened with the page cache
(no ``direct_io``) and ``keep_cache``, so every process maps the same pages. POSIX and
``flock`` locks are left to the kernel (no lock operation), which keeps them per mount.
The mount ends with ``fusermount3 -u``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import mfusepy

BLOCK = 4096


def _fail(code: int) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(code)


@dataclass
class Inode:
    """A file or directory as the programs see it, and where its durable copy is."""

    ino: int
    mode: int
    #: The durable copy: a file under DISK (its durable name) or ORPHANS; None once its
    #: durable name is gone (an unlink committed).
    store: str | None = None
    #: Open on ``store`` (files only) while the inode may still be read or synced.
    fd: int | None = None
    size: int = 0
    durable_size: int = 0
    #: Durable bytes at or past this offset were truncated away (not synced yet).
    shrink_to: int = 0
    dirty: dict[int, bytearray] = field(default_factory=dict)
    #: Names in the programs' view (0 or 1: no hard links) and open handles.
    nlink: int = 1
    opens: int = 0
    mtime_ns: int = field(default_factory=time.time_ns)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    def _durable_block(self, block: int) -> bytes:
        assert self.fd is not None
        start = block * BLOCK
        limit = min(self.shrink_to, self.durable_size)
        return os.pread(self.fd, min(BLOCK, limit - start), start) if start < limit else b""

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size)
        out = bytearray()
        pos = offset
        while pos < end:
            block, within = divmod(pos, BLOCK)
            take = min(BLOCK - within, end - pos)
            buf = self.dirty.get(block)
            piece = bytes(buf[within : within + take]) if buf is not None else b""
            if buf is None:
                piece = self._durable_block(block)[within : within + take]
            out += piece.ljust(take, b"\0")
            pos += take
        return bytes(out)

    def write(self, offset: int, data: bytes) -> None:
        pos, view = offset, memoryview(data)
        while view:
            block, within = divmod(pos, BLOCK)
            take = min(BLOCK - within, len(view))
            buf = self.dirty.get(block)
            if buf is None:
                buf = self.dirty[block] = bytearray(self._durable_block(block).ljust(BLOCK, b"\0"))
            buf[within : within + take] = view[:take]
            view, pos = view[take:], pos + take
        self.size = max(self.size, offset + len(data))
        self.mtime_ns = time.time_ns()

    def truncate(self, length: int) -> None:
        if length < self.size:
            for block in [b for b in self.dirty if b * BLOCK >= length]:
                del self.dirty[block]
            block, within = divmod(length, BLOCK)
            if block in self.dirty:
                self.dirty[block][within:] = bytes(BLOCK - within)
            self.shrink_to = min(self.shrink_to, length)
        self.size = length
        self.mtime_ns = time.time_ns()

    def sync(self, keep: random.Random | None = None, chance: float = 1.0) -> int:
        """Write the unsynced state into the durable copy: all of it, or (``keep``) each
        block and the truncation with probability ``chance``. Returns the blocks left out."""
        if self.fd is None:
            return len(self.dirty)

        def taken() -> bool:
            return keep is None or keep.random() < chance

        if self.shrink_to < self.durable_size and taken():
            os.ftruncate(self.fd, self.shrink_to)
            self.durable_size = self.shrink_to
        left = 0
        for block, buf in sorted(self.dirty.items()):
            if not taken():
                left += 1
                continue
            valid = min(BLOCK, self.size - block * BLOCK)
            os.pwrite(self.fd, bytes(buf[:valid]), block * BLOCK)
            self.durable_size = max(self.durable_size, block * BLOCK + valid)
        if keep is None:
            os.ftruncate(self.fd, self.size)
            self.durable_size = self.shrink_to = self.size
            self.dirty.clear()
        return left


class PowerLossFS(mfusepy.Operations):  # type: ignore[misc]
    """The operations; one lock makes each of them atomic."""

    use_ns = True
    flag_nopath = True
    flag_nullpath_ok = True

    def __init__(self, disk: str, orphans: str) -> None:
        self.disk = os.path.realpath(disk)
        self.orphans = os.path.realpath(orphans)
        self._mutex = threading.Lock()
        self.frozen = False
        #: The cut waiting for a write: (file name, writes to go, chance, seed).
        self.armed: tuple[str, int, float, int] | None = None
        #: What the cut did, once the power is off.
        self.cut_stats: dict[str, Any] | None = None
        self._inos = iter(range(2, 1 << 62))
        self.paths: dict[str, Inode] = {}
        self.handles: dict[int, Inode] = {}
        self.dir_handles: dict[int, str] = {}
        self._fhs = iter(range(1, 1 << 62))
        #: Name changes not yet durable: (op, args...) in the order they were made.
        self.journal: list[tuple[Any, ...]] = []
        self.file_syncs = 0
        self.dir_syncs = 0
        for name in os.listdir(self.orphans):  # never made durable: gone with the power
            os.unlink(os.path.join(self.orphans, name))
        self._load("/")

    # -- the durable state at start ---------------------------------------------------------

    def _load(self, path: str) -> None:
        real = self._disk_path(path)
        st = os.lstat(real)
        inode = Inode(next(self._inos), st.st_mode, store=real, mtime_ns=st.st_mtime_ns)
        if stat.S_ISREG(st.st_mode):
            inode.fd = os.open(real, os.O_RDWR)
            inode.size = inode.durable_size = inode.shrink_to = st.st_size
        self.paths[path] = inode
        if inode.is_dir:
            for name in os.listdir(real):
                self._load(os.path.join(path, name))

    def _disk_path(self, path: str) -> str:
        return self.disk + path if path != "/" else self.disk

    # -- helpers ----------------------------------------------------------------------------

    def _check(self) -> None:
        if self.frozen:
            raise _fail(errno.EIO)

    def _get(self, path: str | None, fh: int | None = None) -> Inode:
        inode = self.handles.get(fh) if fh else None
        if inode is None and path is not None:
            inode = self.paths.get(path)
        if inode is None:
            raise _fail(errno.ENOENT)
        return inode

    def _parent_dir(self, path: str) -> None:
        parent = self.paths.get(os.path.dirname(path))
        if parent is None:
            raise _fail(errno.ENOENT)
        if not parent.is_dir:
            raise _fail(errno.ENOTDIR)

    def _children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return [
            p
            for p in self.paths
            if p.startswith(prefix) and p != prefix and "/" not in p[len(prefix) :]
        ]

    def _open(self, inode: Inode, fi: Any) -> int:
        fh = next(self._fhs)
        self.handles[fh] = inode
        inode.opens += 1
        fi.fh = fh
        fi.keep_cache = 1  # every process maps the same pages (SQLite's -shm)
        return 0

    # -- commits of the name journal --------------------------------------------------------

    def _commit(self, count: int | None = None) -> None:
        entries = self.journal if count is None else self.journal[:count]
        for entry in entries:
            self._apply(entry)
        del self.journal[: len(entries)]

    def _apply(self, entry: tuple[Any, ...]) -> None:
        op = entry[0]
        if op == "mkdir":
            _, path, inode = entry
            os.mkdir(self._disk_path(path), 0o700)
            inode.store = self._disk_path(path)
        elif op == "rmdir":
            os.rmdir(self._disk_path(entry[1]))
        elif op == "create":
            _, path, inode = entry
            assert inode.store is not None
            os.rename(inode.store, self._disk_path(path))
            inode.store = self._disk_path(path)
        elif op == "unlink":
            _, path, inode = entry
            os.unlink(self._disk_path(path))
            self._forget_store(inode)
        elif op == "rename":
            _, old, new, moved, replaced = entry
            src, dst = self._disk_path(old), self._disk_path(new)
            os.rename(src, dst)
            if replaced is not None:
                self._forget_store(replaced)
            for inode in [*self.paths.values(), *self.handles.values(), moved]:
                if inode.store is not None and (
                    inode.store == src or inode.store.startswith(src + "/")
                ):
                    inode.store = dst + inode.store[len(src) :]

    def _forget_store(self, inode: Inode) -> None:
        inode.store = None
        if inode.opens == 0 and inode.nlink == 0 and inode.fd is not None:
            os.close(inode.fd)
            inode.fd = None

    # -- the power cut ----------------------------------------------------------------------

    def cut(self, chance: float, seed: int) -> dict[str, Any]:
        """The power cut (see the module's docstring); a second cut changes nothing and
        answers what the first one did."""
        with self._mutex:
            return self._cut(chance, seed)

    def arm(self, name: str, nth: int, chance: float, seed: int) -> dict[str, Any]:
        """Cut the power during the ``nth`` write to the file ``name`` (of the top directory)
        from now on: that write fails, as every later operation does."""
        with self._mutex:
            self.armed = (name, nth, chance, seed)
            return {"armed": name}

    def _cut(self, chance: float, seed: int) -> dict[str, Any]:
        if self.cut_stats is not None:
            return self.cut_stats
        self.frozen = True
        rng = random.Random(seed)
        dirty_files = self._dirty_files()
        journal = len(self.journal)
        lost = sum(dirty_files.values())
        committed = 0
        if chance > 0:
            lost = sum(i.sync(rng, chance) for i in self._inodes() if not i.is_dir)
            committed = journal if chance >= 1 else rng.randint(0, journal)
            self._commit(committed)
        self.cut_stats = {
            "unsynced_blocks": sum(dirty_files.values()),
            "blocks_lost": lost,
            "dirty_files": dirty_files,
            "journal": journal,
            "journal_lost": journal - committed,
        }
        return self.cut_stats

    def _armed_write(self, inode: Inode) -> None:
        """Count a write against the armed cut; cut when it is the one."""
        if self.armed is None:
            return
        name, nth, chance, seed = self.armed
        if self.paths.get("/" + name) is not inode:
            return
        if nth > 1:
            self.armed = (name, nth - 1, chance, seed)
            return
        self.armed = None
        self._cut(chance, seed)
        raise _fail(errno.EIO)

    def stats(self) -> dict[str, Any]:
        with self._mutex:
            dirty_files = self._dirty_files()
            return {
                "file_syncs": self.file_syncs,
                "dir_syncs": self.dir_syncs,
                "unsynced_blocks": sum(dirty_files.values()),
                "dirty_files": dirty_files,
                "journal": len(self.journal),
                "cut": self.cut_stats,
            }

    def _inodes(self) -> list[Inode]:
        return list({id(i): i for i in [*self.paths.values(), *self.handles.values()]}.values())

    def _dirty_files(self) -> dict[str, int]:
        """Unsynced blocks by file name (an unlinked file's count under "(unlinked)")."""
        names = {id(i): os.path.basename(p) for p, i in self.paths.items()}
        dirty: dict[str, int] = {}
        for inode in self._inodes():
            if inode.dirty:
                name = names.get(id(inode), "(unlinked)")
                dirty[name] = dirty.get(name, 0) + len(inode.dirty)
        return dirty

    # -- FUSE operations --------------------------------------------------------------------

    def init(self, path: str) -> None:
        print(json.dumps({"mounted": True}), flush=True)

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            self._check()
            inode = self._get(path, fh)
            return {
                "st_mode": inode.mode,
                "st_ino": inode.ino,
                "st_nlink": (2 if inode.is_dir else inode.nlink),
                "st_size": inode.size if not inode.is_dir else BLOCK,
                "st_blocks": (inode.size + 511) // 512,
                "st_blksize": BLOCK,
                "st_uid": os.getuid(),
                "st_gid": os.getgid(),
                "st_atime": inode.mtime_ns,
                "st_mtime": inode.mtime_ns,
                "st_ctime": inode.mtime_ns,
            }

    def opendir(self, path: str) -> int:
        with self._mutex:
            self._check()
            if not self._get(path).is_dir:
                raise _fail(errno.ENOTDIR)
            fh = next(self._fhs)
            self.dir_handles[fh] = path
            return fh

    def releasedir(self, path: str | None, fh: int) -> int:
        with self._mutex:
            self.dir_handles.pop(fh, None)
            return 0

    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        with self._mutex:
            self._check()
            where = path if path is not None else self.dir_handles.get(fh, "/")
            here = self._get(where)
            entries = [(".", here), ("..", here)]
            entries += [(os.path.basename(p), self.paths[p]) for p in self._children(where)]
            return [(name, {"st_mode": i.mode, "st_ino": i.ino}, 0) for name, i in entries]

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.disk)
        return {key: getattr(st, key) for key in (
            "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
            "f_favail", "f_namemax")}  # fmt: skip

    def access(self, path: str, amode: int) -> int:
        return 0

    def chmod(self, path: str | None, mode: int) -> int:
        with self._mutex:
            self._check()
            inode = self._get(path)
            inode.mode = stat.S_IFMT(inode.mode) | stat.S_IMODE(mode)
            return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        with self._mutex:
            self._check()
            self._get(path)
            return 0

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        with self._mutex:
            self._check()
            inode = self._get(path)
            inode.mtime_ns = times[1] if times else time.time_ns()
            return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            self._check()
            self._parent_dir(path)
            if path in self.paths:
                raise _fail(errno.EEXIST)
            inode = Inode(next(self._inos), stat.S_IFDIR | stat.S_IMODE(mode))
            self.paths[path] = inode
            self.journal.append(("mkdir", path, inode))
            return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            self._check()
            inode = self._get(path)
            if not inode.is_dir:
                raise _fail(errno.ENOTDIR)
            if self._children(path):
                raise _fail(errno.ENOTEMPTY)
            del self.paths[path]
            self.journal.append(("rmdir", path))
            return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._mutex:
            self._check()
            self._parent_dir(path)
            if path in self.paths:
                raise _fail(errno.EEXIST)
            ino = next(self._inos)
            store = os.path.join(self.orphans, str(ino))
            inode = Inode(ino, stat.S_IFREG | stat.S_IMODE(mode), store=store)
            inode.fd = os.open(store, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            self.paths[path] = inode
            self.journal.append(("create", path, inode))
            return self._open(inode, fi)

    def open(self, path: str, fi: Any) -> int:
        with self._mutex:
            self._check()
            inode = self._get(path)
            if inode.is_dir:
                raise _fail(errno.EISDIR)
            return self._open(inode, fi)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            self._check()
            return self._get(path, fh).read(offset, size)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            self._check()
            inode = self._get(path, fh)
            self._armed_write(inode)
            inode.write(offset, data)
            return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self._mutex:
            self._check()
            inode = self._get(path, fh)
            if inode.is_dir:
                raise _fail(errno.EISDIR)
            inode.truncate(length)
            return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self._mutex:
            self._check()
            self._get(path, fh).sync()
            self.file_syncs += 1
            return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        with self._mutex:
            self._check()
            self._commit()
            self.dir_syncs += 1
            return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close() makes nothing durable

    def release(self, path: str | None, fh: int) -> int:
        with self._mutex:
            inode = self.handles.pop(fh, None)
            if inode is not None:
                inode.opens -= 1
                if inode.opens == 0 and inode.nlink == 0:
                    inode.dirty.clear()  # nobody can read it again
                    if inode.store is None and inode.fd is not None:
                        os.close(inode.fd)
                        inode.fd = None
            return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            self._check()
            inode = self._get(path)
            if inode.is_dir:
                raise _fail(errno.EISDIR)
            del self.paths[path]
            inode.nlink = 0
            self.journal.append(("unlink", path, inode))
            return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            self._check()
            moved = self._get(old)
            self._parent_dir(new)
            replaced = self.paths.get(new)
            if replaced is not None:
                if replaced.is_dir and self._children(new):
                    raise _fail(errno.ENOTEMPTY)
                replaced.nlink = 0
            for path in [p for p in self.paths if p == old or p.startswith(old + "/")]:
                self.paths[new + path[len(old) :]] = self.paths.pop(path)
            self.journal.append(("rename", old, new, moved, replaced))
            return 0


class _Fuse(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's bridge, with the file handle passed to truncate (an ``ftruncate`` of an
    unlinked file has no path) and ``fuse_file_info`` handed to open and create."""

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        fh = fip.contents.fh if fip else None
        name = None if path is None else path.decode(self.encoding, self.errors)
        return int(self.operations.truncate(name, length, fh))

    def open(self, path: bytes, fip: Any) -> int:
        return int(self.operations.open(path.decode(self.encoding, self.errors), fip.contents))

    def create(self, path: bytes, mode: int, fip: Any) -> int:
        name = path.decode(self.encoding, self.errors)
        return int(self.operations.create(name, mode, fip.contents))


def _control(fs: PowerLossFS) -> None:
    """The commands on standard input (see the module's docstring)."""
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "cut":
            answer: dict[str, Any] = fs.cut(float(words[1]), int(words[2]))
        elif words[0] == "arm":
            answer = fs.arm(words[1], int(words[2]), float(words[3]), int(words[4]))
        elif words[0] == "stats":
            answer = fs.stats()
        else:
            answer = {"error": f"unknown command {words[0]}"}
        print(json.dumps(answer), flush=True)


def main(argv: list[str]) -> int:
    disk, orphans, mountpoint = argv
    logging.basicConfig(level=logging.WARNING, format="faultfs: %(message)s")
    fs = PowerLossFS(disk, orphans)
    threading.Thread(target=_control, args=(fs,), daemon=True).start()
    _Fuse(
        fs,
        mountpoint,
        foreground=True,
        use_ino=True,
        hard_remove=True,
        fsname="faultfs",
        debug=bool(os.environ.get("FAULTFS_DEBUG")),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
