"""The operating-system confinement of the scoring sandbox: namespaces, a read-only file system,
an unprivileged user, resource limits and a system-call filter, each applied by one function.

``sandbox.py`` calls these in two places. Its supervisor (a child of the scoring process that
never evaluates answer text) calls ``enter_namespaces`` before importing the scorer (its own
network namespace with no links: loopback stays down, so no address is reachable; its own mount
namespace; a user namespace first when not root) and ``seal`` after: every mount read-only, the
directories on the interpreter's path shown to ``nobody`` when they are hidden (``/root`` holding
a pyenv interpreter), itself not dumpable. Each evaluator (forked by the supervisor, one per
request) calls ``set_limits`` and ``confine_evaluator``: address space, file size 0, descriptors,
no core; the user ``nobody`` when the supervisor is root; no processes or threads; not dumpable; no
new privileges; and a seccomp filter that refuses sockets (a Unix socket on a read-only file system
can still be connected to: PostgreSQL's, say), signals and tracing of other processes, ``exec``,
new processes and threads, namespace and mount calls, and io_uring (which would bypass the
filter); then ``limit_cpu`` once it knows its request's timeout.

What is not confined: the evaluator can read whatever ``nobody`` may read, can use CPU and memory
up to its limits, and shares the machine's process-ID namespace (it sees other processes' command
lines in ``/proc``). Every step degrades to a reported absence (``Isolation``) instead of failing,
because the strict answer grammars (``answer_grammar.py``) are the first defence; the caller logs
what is missing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
import resource
import stat
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass

# The unprivileged user and group evaluators run as when the supervisor is root: ``nobody``, which
# owns no files, so it can write nothing that the read-only mounts would not already refuse.
NOBODY_ID = 65534

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
# Per-mount flags a read-only remount must keep (the kernel refuses to clear a locked one).
_MOUNT_OPTION_FLAGS = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
    "nosymfollow": 256,
}
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 4, 38, 22, 2

# System calls the filter refuses with EPERM, per architecture (numbers from the kernel's unistd
# headers): sockets, tracing and signalling other processes, exec, new processes and threads,
# namespaces, mounts, io_uring, bpf, perf, userfaultfd and the key ring.
_SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    # machine: (AUDIT_ARCH_*, name -> number)
    "x86_64": (
        0xC000003E,
        dict(
            socket=41, socketpair=53, connect=42, ptrace=101, process_vm_readv=310, process_vm_writev=311,
            kill=62, tkill=200, tgkill=234, rt_sigqueueinfo=129, rt_tgsigqueueinfo=297,
            pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438, unshare=272, setns=308,
            io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=321, perf_event_open=298,
            userfaultfd=323, keyctl=250, add_key=248, request_key=249, execve=59, execveat=322, clone=56,
            clone3=435, fork=57, vfork=58, mount=165, umount2=166, mount_setattr=442, open_tree=428,
            move_mount=429, fsopen=430, fsmount=432,
        ),  # fmt: skip
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            socket=198, socketpair=199, connect=203, ptrace=117, process_vm_readv=270, process_vm_writev=271,
            kill=129, tkill=130, tgkill=131, rt_sigqueueinfo=138, rt_tgsigqueueinfo=240,
            pidfd_send_signal=424, pidfd_open=434, pidfd_getfd=438, unshare=97, setns=268,
            io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=280, perf_event_open=241,
            userfaultfd=282, keyctl=219, add_key=217, request_key=218, execve=221, execveat=281, clone=220,
            clone3=435, mount=40, umount2=39, mount_setattr=442, open_tree=428, move_mount=429,
            fsopen=430, fsmount=432,
        ),  # fmt: skip
    ),
}
# Rounds of covering hidden directories: each round uncovers one more level of a nested hidden path;
# real interpreters need one (``/root``), so more means something is wrong.
_MAX_EXPOSE_PASSES = 8
# On x86-64 a system call number with this bit set is an x32 call, which the filter must not let
# past under another number.
_X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class Isolation:
    """What the supervisor obtained; an evaluator adds the user, limits and filter on top."""

    network: bool  # own network namespace, no links
    filesystem: bool  # own mount namespace, every mount read-only
    user: str  # "nobody" (dropped from root) or "unchanged" (the supervisor was not root)
    seccomp: bool  # the system-call filter is available on this machine
    problems: tuple[str, ...] = ()  # why a part is missing, one line each

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "problems": list(self.problems)}

    @property
    def complete(self) -> bool:
        return self.network and self.filesystem and self.user == "nobody" and self.seccomp


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _mount(
    libc: ctypes.CDLL, source: str | None, target: str, kind: str | None, flags: int, data: str = ""
) -> None:
    def encode(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    options = ctypes.c_char_p(data.encode()) if data else None
    _check(libc.mount(encode(source), target.encode(), encode(kind), flags, options), f"mount {target}")


def _mounts() -> list[tuple[str, int]]:
    """Every mount point of this namespace with the flags a remount must keep."""
    mounts = []
    with open("/proc/self/mountinfo") as lines:
        for line in lines:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), fields[4])  # "\040"
            flags = sum(_MOUNT_OPTION_FLAGS.get(option, 0) for option in fields[5].split(","))
            mounts.append((point, flags))
    return mounts


def _expose(libc: ctypes.CDLL, paths: Iterable[str]) -> None:
    """Make each path traversable by other users inside this mount namespace: a directory on the way
    that others cannot enter (``/root`` holding the interpreter) is covered by a small read-only tmpfs
    that holds only the components the paths need, bind-mounted from the originals; nothing else of
    that directory is shown."""
    targets = [os.path.realpath(path) for path in paths]
    for _ in range(_MAX_EXPOSE_PASSES):
        needed: dict[str, set[str]] = {}
        for target in targets:
            directory = "/"
            for part in (part for part in target.split("/") if part):
                child = os.path.join(directory, part)
                if not os.path.lexists(child):
                    break
                if not os.stat(directory).st_mode & stat.S_IXOTH:
                    needed.setdefault(directory, set()).add(part)
                    break
                directory = child
        if not needed:
            return
        for directory, parts in needed.items():
            held = {part: os.open(os.path.join(directory, part), os.O_PATH) for part in sorted(parts)}
            try:
                _mount(libc, "tmpfs", directory, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
                for part, descriptor in held.items():
                    child = os.path.join(directory, part)
                    if stat.S_ISDIR(os.fstat(descriptor).st_mode):
                        os.mkdir(child)
                    else:
                        os.close(os.open(child, os.O_CREAT | os.O_WRONLY, 0o644))
                    _mount(libc, f"/proc/self/fd/{descriptor}", child, None, _MS_BIND | _MS_REC)
            finally:
                for descriptor in held.values():
                    os.close(descriptor)
    raise OSError(errno.ELOOP, f"paths still hidden after {_MAX_EXPOSE_PASSES} passes: {targets}")


def enter_namespaces(unprivileged: bool) -> list[str]:
    """Move this (single-threaded) process into its own network and mount namespaces; a user
    namespace first when not root (or ``unprivileged``, which behaves as a non-root caller does).
    Returns the problems, empty when it worked."""
    root = os.geteuid() == 0 and not unprivileged
    try:
        _check(_libc().unshare(_CLONE_NEWNS | _CLONE_NEWNET | (0 if root else _CLONE_NEWUSER)), "unshare")
    except OSError as error:
        return [f"no network or mount namespace ({error}); evaluators share the machine's"]
    return []


def seal(expose: Iterable[str], namespaces: bool, unprivileged: bool) -> Isolation:
    """After ``enter_namespaces`` and the supervisor's imports: every mount read-only (after exposing
    ``expose`` to other users when evaluators will become nobody), this process not dumpable, and
    the report of what was obtained."""
    libc = _libc()
    problems: list[str] = []
    root = os.geteuid() == 0 and not unprivileged
    filesystem = False
    if namespaces:
        try:
            _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates out
            if root:
                _expose(libc, expose)
            failed = []
            for point, flags in _mounts():
                try:
                    _mount(libc, None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)
                except OSError as error:
                    if error.errno != errno.ENOENT:  # a mount point that is gone needs nothing
                        failed.append(str(error))
            if failed:
                problems.append(f"some mounts left writable: {'; '.join(failed[:3])}")
            else:
                filesystem = True
        except OSError as error:
            problems.append(f"file system left writable ({error})")
    # Not dumpable: another process of this user can neither trace it nor open its /proc entries.
    _check(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    seccomp = platform.machine() in _SYSCALLS
    if not seccomp:
        problems.append(f"no system-call filter for machine {platform.machine()!r}")
    if not root:
        problems.append("not root, so evaluators keep this user instead of becoming nobody")
    return Isolation(namespaces, filesystem, "nobody" if root else "unchanged", seccomp, tuple(problems))


def set_limits(memory_bytes: int, open_files: int) -> None:
    """Address space, file size (0: no file can grow), descriptors and core dumps of this process."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def limit_cpu(seconds: int) -> None:
    """CPU seconds from now on (SIGXCPU, then SIGKILL one second later)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime) + seconds
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))


def address_space_bytes() -> int:
    """The address space this process maps now (from ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def confine_evaluator(drop_to_nobody: bool) -> None:
    """The irreversible part, in the evaluator after its limits: the user ``nobody`` (from root),
    no processes or threads, not dumpable, no new privileges, and the system-call filter."""
    libc = _libc()
    if drop_to_nobody:
        os.setgroups([])
        os.setresgid(NOBODY_ID, NOBODY_ID, NOBODY_ID)
        os.setresuid(NOBODY_ID, NOBODY_ID, NOBODY_ID)
        if os.getresuid() != (NOBODY_ID,) * 3 or os.getresgid() != (NOBODY_ID,) * 3:
            os._exit(70)  # never evaluate with privileges left
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            os._exit(70)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    _check(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _install_filter(libc)


def _install_filter(libc: ctypes.CDLL) -> None:
    machine = platform.machine()
    if machine not in _SYSCALLS:
        return  # reported by seal
    arch, numbers = _SYSCALLS[machine]
    load_word, jump_equal, jump_greater_equal, ret = 0x20, 0x15, 0x35, 0x06
    kill_process, allow, refuse = 0x80000000, 0x7FFF0000, 0x00050000 | errno.EPERM
    program = [
        (load_word, 0, 0, 4),  # seccomp_data.arch
        (jump_equal, 1, 0, arch),
        (ret, 0, 0, kill_process),
        (load_word, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        program += [(jump_greater_equal, 0, 1, _X32_SYSCALL_BIT), (ret, 0, 0, kill_process)]
    for number in sorted(numbers.values()):
        program += [(jump_equal, 0, 1, number), (ret, 0, 0, refuse)]
    program.append((ret, 0, 0, allow))
    code = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    filters = ctypes.create_string_buffer(code)

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Program(len(program), ctypes.addressof(filters))
    _check(
        libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )
