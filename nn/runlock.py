"""The out directory's lock: one trainer writes a run's checkpoint at a time.

`RunLock(out).acquire()` creates LOCK there (the owner's pid, host and start time) with
O_CREAT | O_EXCL, so of two trainers starting at once exactly one gets it; a stale lock (its
owner on this host is dead) is removed and taken. examples/train_gpt.py holds it for the
whole run (rank 0 only, when data-parallel).
"""

from __future__ import annotations

import json
import os
import socket
import time

LOCK = "train.lock"  # in the out directory while a trainer writes there (RunLock)


def _host() -> str:
    return socket.gethostname() or "localhost"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


class RunLocked(RuntimeError):
    """Another trainer holds the out directory's lock."""


class RunLock:
    """A lock file in an out directory (LOCK: the owner's pid, host and start time) that
    keeps two trainers from writing one checkpoint. It is created with O_CREAT | O_EXCL,
    so of two trainers starting at once exactly one gets it; a lock whose owner on this
    host is dead (killed with SIGKILL, say) is removed and taken. An OSError from acquire
    means the directory cannot be written."""

    _held: set = set()  # lock paths this process holds (a pid reused after a reboot aside)

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LOCK)

    def acquire(self) -> RunLock:
        owner = {"pid": os.getpid(), "host": _host(),
                 "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(100):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                held = self._owner()
                if not self._stale(held):
                    raise RunLocked(self._refusal(held)) from None
                self._remove_stale(held)
                continue
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(owner, f)
            except BaseException:  # a lock without its owner would refuse every trainer
                os.unlink(self.path)
                raise
            RunLock._held.add(os.path.abspath(self.path))
            return self
        raise RunLocked(f"could not take the lock {self.path}: other trainers keep taking it")

    def _remove_stale(self, held: dict) -> None:
        """Delete the lock `held` described, if it is still that one. Two trainers that
        both found it stale must not both delete: the second would delete the lock the
        first has just taken. So removing takes a second O_EXCL file, and re-reads the
        lock under it."""
        breaker = self.path + ".break"
        try:
            fd = os.open(breaker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # another trainer is removing it; wait, then look again
            try:
                if time.time() - os.path.getmtime(breaker) > 10:  # its remover died
                    os.unlink(breaker)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
            return
        try:
            if held and self._owner() == held:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
            os.unlink(breaker)

    def release(self) -> None:
        key = os.path.abspath(self.path)
        if key in RunLock._held:
            RunLock._held.discard(key)
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _owner(self) -> dict | None:
        try:
            with open(self.path) as f:
                owner = json.load(f)
            int(owner["pid"]), str(owner["host"])
            return owner
        except FileNotFoundError:
            return {}  # released meanwhile: stale, try again
        except (OSError, ValueError, KeyError, TypeError):
            return None  # being written now, or not ours to judge

    def _stale(self, owner: dict | None) -> bool:
        if owner == {}:
            return True
        if owner is None or owner["host"] != _host():
            return False
        pid = int(owner["pid"])
        if pid == os.getpid():  # ours only if this process took it
            return os.path.abspath(self.path) not in RunLock._held
        return not _pid_alive(pid)

    def _refusal(self, owner: dict | None) -> str:
        directory = os.path.dirname(self.path) or "."
        if owner is None:
            who = (f"its lock file {self.path} holds no owner yet: a trainer is taking it "
                   "now, or died while taking it")
        else:
            who = (f"pid {owner['pid']} on host {owner['host']} holds {self.path} since "
                   f"{owner.get('started', '?')}")
        return (f"{directory} is in use by another trainer ({who}); wait for it to finish or "
                "use another out directory. If that trainer is gone (on another host, say), "
                "delete the lock file.")
