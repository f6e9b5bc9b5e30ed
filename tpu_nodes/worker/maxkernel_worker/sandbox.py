"""The worker's sandbox, applied once at start, before jax (or any thread) exists.

Protections, each applied independently; one that the kernel refuses is left out of the
returned list (and logged) instead of stopping the worker (docs/sandbox.md):
  netns           a private network namespace without interfaces (no network at all)
  mountns         a private mount namespace: the mounts below never reach the host
  disk            the private directory (WORKDIR/private) is a tmpfs of `disk_limit` bytes:
                  the only writable place, and a full one cannot fill the host's disk
  hide            the directories and files given (the cluster token, the node's state) are
                  covered by empty, mode-000 mounts: opening anything there is EACCES
  pids            a pids cgroup of its own (max_processes tasks, threads included): a fork
                  bomb gets EAGAIN; the C++ parent kills the cgroup's tasks with the worker
  nproc           fallback when no pids cgroup is writable: RLIMIT_NPROC (it binds non-root
                  users only)
  cleanenv        environment reduced to a whitelist; HOME, TMPDIR, cwd = the private dir
  rlimits         data segment, file size, open files, no core dumps; CPU seconds are a
                  per-request budget (cpu_budget)
  landlock        file writes only beneath the private dir (plus /dev/null, the socket's
                  directory, where only the socket may be made)
  landlock-net    TCP bind and connect refused (Landlock ABI >= 4)
  landlock-scope  no abstract unix sockets or signals outside the sandbox (ABI >= 6)
  noprocs         a seccomp filter: fork, vfork, clone without CLONE_THREAD and execve fail
                  with EPERM (threads still start), so no candidate starts a process, whatever
                  path it takes to the system call (the pids cgroup is the second line)
  nocaps          every capability dropped, bounding set included (root cannot setns back,
                  mount, override file permissions, or read /proc of privileged processes)
Namespaces and Landlock act on the calling thread only, hence "before any thread".
"""

import contextlib
import ctypes
import errno
import math
import os
import resource
import signal
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# x86_64 and aarch64 share these numbers (the Landlock syscalls are new and unified).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_SYS_CAPSET = 126 if os.uname().machine == "x86_64" else 91

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4

_FS_WRITE_FILE = 1 << 1
_FS_REMOVE_DIR = 1 << 4
_FS_REMOVE_FILE = 1 << 5
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_DIR = 1 << 7
_FS_MAKE_REG = 1 << 8
_FS_MAKE_SOCK = 1 << 9
_FS_MAKE_FIFO = 1 << 10
_FS_MAKE_BLOCK = 1 << 11
_FS_MAKE_SYM = 1 << 12
_FS_REFER = 1 << 13      # ABI 2
_FS_TRUNCATE = 1 << 14   # ABI 3
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
_SCOPE_SIGNAL = 1 << 1
_RULE_PATH_BENEATH = 1

# Variables a JAX worker legitimately reads; everything else (tokens, cloud credentials,
# proxies) is dropped.
_ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
             "PYTHONUNBUFFERED", "TZ")
_ENV_KEEP_PREFIXES = ("LC_", "JAX_", "XLA_", "TPU_", "LIBTPU_", "PALLAS_", "OPENBLAS_")

DEFAULT_DISK_LIMIT = 1 << 30
DEFAULT_OPEN_FILES = 4096
DEFAULT_CPU_SECONDS = 3600
PRIVATE_DIR = "private"            # beneath the workdir: the candidates' only writable place
CGROUP_PREFIX = "maxkernel-worker-"   # + the worker's pid; worker_process.cpp removes it


def default_max_processes() -> int:
    """Tasks (threads included) a worker may have: XLA starts a few per core."""
    return max(1024, 8 * (os.cpu_count() or 1))


class CpuLimitExceeded(BaseException):
    """Raised in the main thread when a request used its CPU seconds (SIGXCPU). A
    BaseException, so that a candidate's `except Exception` does not swallow it."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _log(message: str) -> None:
    print(f"maxkernel_worker sandbox: {message}", file=sys.stderr, flush=True)


def _errno_text() -> str:
    e = ctypes.get_errno()
    return f"{errno.errorcode.get(e, e)} ({os.strerror(e)})"


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is unavailable."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(1))
    return max(int(abi), 0)


def clean_environment(workdir: str) -> None:
    for key in list(os.environ):
        if key not in _ENV_KEEP and not key.startswith(_ENV_KEEP_PREFIXES):
            del os.environ[key]
    for key in ("HOME", "TMPDIR", "TMP", "TEMP"):
        os.environ[key] = workdir
    os.chdir(workdir)


def _enter_namespaces(network: bool, mount: bool = True) -> list[str]:
    """A private mount namespace, and a network one unless `network` must stay reachable."""
    flags = (_CLONE_NEWNS if mount else 0) | (_CLONE_NEWNET if not network else 0)
    names = (["netns"] if not network else []) + (["mountns"] if mount else [])
    if os.geteuid() == 0:
        if _libc.unshare(flags) != 0:
            raise OSError(f"unshare: {_errno_text()}")
    else:
        # Unprivileged: a user namespace first, mapping our ids to themselves so files we
        # create keep their owner.
        uid, gid = os.geteuid(), os.getegid()
        if _libc.unshare(_CLONE_NEWUSER | flags) != 0:
            raise OSError(f"unshare(CLONE_NEWUSER|...): {_errno_text()}")
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    # Nothing mounted from here on propagates back to the host's namespace.
    if mount and _libc.mount(b"none", b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        raise OSError(f"mount --make-rprivate /: {_errno_text()}")
    return names


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                   ctypes.c_ulong(flags), data.encode() if data else None) != 0:
        raise OSError(f"mount {fstype or source} on {target}: {_errno_text()}")


def _private_tmpfs(private: str, disk_limit: int) -> None:
    _mount("maxkernel-private", private, "tmpfs", _MS_NOSUID | _MS_NODEV,
           f"size={disk_limit},mode=0700")


def _contains(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _hide(paths: list[str], needed: list[str], blank_file: str) -> list[str]:
    """Covers each path with an empty mode-000 mount; returns those it hid. A path that
    holds something the worker needs (its workdir, the venv, the package) is left visible."""
    hidden = []
    # Files first: a directory mounted over them afterwards hides them anyway.
    for path in sorted(paths, key=os.path.isdir):
        real = os.path.realpath(path)
        if not os.path.exists(real):
            continue
        blocking = [n for n in needed if _contains(real, n)]
        if blocking:
            _log(f"hide: {real} left visible: it holds {blocking[0]}, which the worker needs")
            continue
        if os.path.isdir(real):
            _mount("maxkernel-hidden", real, "tmpfs",
                   _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=4k,mode=000")
        else:
            _mount(blank_file, real, None, _MS_BIND, None)
        hidden.append(real)
    return hidden


def _own_cgroup(controller: str) -> str | None:
    """The mounted directory of this process's cgroup for `controller` (v1, else v2)."""
    unified = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return os.path.join("/sys/fs/cgroup", controller, path.lstrip("/"))
            if controllers == "":
                unified = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
    return unified


def _pids_cgroup(max_processes: int) -> None:
    parent = _own_cgroup("pids")
    if parent is None or not os.access(parent, os.W_OK):
        raise OSError(f"no writable pids cgroup ({parent or 'none mounted'})")
    # Cgroups of workers that died without their parent's cleanup (a crashed node).
    for name in os.listdir(parent):
        if name.startswith(CGROUP_PREFIX) and not os.path.exists(f"/proc/{name[len(CGROUP_PREFIX):]}"):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(parent, name))
    group = os.path.join(parent, f"{CGROUP_PREFIX}{os.getpid()}")
    os.makedirs(group, exist_ok=True)
    try:
        with open(os.path.join(group, "pids.max"), "w") as f:
            f.write(str(max_processes))
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(group)
        raise


def _tasks_of_uid(uid: int) -> int:
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
    return count


def _nproc_limit(max_processes: int) -> None:
    # RLIMIT_NPROC counts every task of the real uid, not only ours, and never binds root.
    if os.getuid() == 0:
        raise OSError("RLIMIT_NPROC does not bind root")
    _set_limit(resource.RLIMIT_NPROC, _tasks_of_uid(os.getuid()) + max_processes)


def _drop_capabilities() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        # EINVAL for caps this kernel does not know; EPERM once CAP_SETPCAP is gone.
        _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(0x20080522, 0)   # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if _libc.syscall(_SYS_CAPSET, ctypes.byref(header), ctypes.byref(data)) != 0:
        raise OSError(f"capset: {_errno_text()}")


def _landlock(abi: int, write_dirs: list[str], socket_dirs: list[str],
              write_files: list[str]) -> list[str]:
    dir_rights = (_FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_CHAR
                  | _FS_MAKE_DIR | _FS_MAKE_REG | _FS_MAKE_SOCK | _FS_MAKE_FIFO
                  | _FS_MAKE_BLOCK | _FS_MAKE_SYM)
    file_rights = _FS_WRITE_FILE
    if abi >= 2:
        dir_rights |= _FS_REFER
    if abi >= 3:
        dir_rights |= _FS_TRUNCATE
        file_rights |= _FS_TRUNCATE
    attr = _RulesetAttr(handled_access_fs=dir_rights)
    in_force = ["landlock"]
    if abi >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP   # no rules: all denied
        in_force.append("landlock-net")
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        in_force.append("landlock-scope")
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                            ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(f"landlock_create_ruleset: {_errno_text()}")
    try:
        rules = ([(d, dir_rights) for d in write_dirs]
                 + [(d, _FS_MAKE_SOCK | _FS_REMOVE_FILE) for d in socket_dirs]
                 + [(p, file_rights) for p in write_files])
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                _log(f"landlock: no rule for {path}: {e}")
                continue
            try:
                rule = _PathBeneathAttr(rights, fd)
                if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                 ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                                 ctypes.c_uint32(0)) != 0:
                    raise OSError(f"landlock_add_rule {path}: {_errno_text()}")
            finally:
                os.close(fd)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(f"prctl(PR_SET_NO_NEW_PRIVS): {_errno_text()}")
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset),
                         ctypes.c_uint32(0)) != 0:
            raise OSError(f"landlock_restrict_self: {_errno_text()}")
    finally:
        os.close(ruleset)
    return in_force


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


# (audit arch, syscalls that start a process, clone, clone3) per machine.
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, (57, 58, 59, 322), 56, 435),      # fork vfork execve execveat
    "aarch64": (0xC00000B7, (221, 281), 220, 435),           # execve execveat
}


def _no_processes() -> None:
    """A seccomp filter that refuses new processes and allows threads."""
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCH:
        raise OSError(f"no seccomp filter for {machine}")
    arch, denied, clone, clone3 = _SECCOMP_ARCH[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM
    nosys = 0x00050000 | errno.ENOSYS   # glibc then starts threads with clone (checked below)
    body = [("jeq_deny", arch, True)]   # other ABIs (i386 on x86_64): refused outright
    body += [("ld", 0)]
    if machine == "x86_64":
        body += [("jge", 0x40000000)]   # the x32 ABI
    body += [("jeq", nr) for nr in denied] + [("jeq_nosys", clone3), ("jeq_clone", clone),
                                               ("ld", 16), ("jset_thread", 0x00010000)]
    # Layout: [ld arch] body... ALLOW DENY NOSYS
    program = [(ld, 0, 0, 4)]
    n = 1 + len(body)
    labels = {"allow": n, "deny": n + 1, "nosys": n + 2}
    for i, step in enumerate(body):
        pc = 1 + i

        def to(label):
            return labels[label] - pc - 1
        kind, k = step[0], step[1]
        if kind == "ld":
            program.append((ld, 0, 0, k))
        elif kind == "jeq_deny":
            program.append((jeq, 0, to("deny"), k))
        elif kind == "jge":
            program.append((jge, to("deny"), 0, k))
        elif kind == "jeq":
            program.append((jeq, to("deny"), 0, k))
        elif kind == "jeq_nosys":
            program.append((jeq, to("nosys"), 0, k))
        elif kind == "jeq_clone":
            program.append((jeq, 0, to("allow"), k))
        elif kind == "jset_thread":
            program.append((jset, to("allow"), to("deny"), k))
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny), (ret, 0, 0, nosys)]
    filters = (_SockFilter * len(program))(*[_SockFilter(*p) for p in program])
    prog = _SockFprog(len(program), filters)
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(f"prctl(PR_SET_NO_NEW_PRIVS): {_errno_text()}")
    if _libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:   # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(f"prctl(PR_SET_SECCOMP): {_errno_text()}")


def _set_limit(which: int, value: int) -> None:
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value if hard == resource.RLIM_INFINITY else hard))


def _rlimits(memory_limit: int, disk_limit: int) -> None:
    # RLIMIT_DATA, not RLIMIT_AS: XLA reserves far more address space than it touches.
    _set_limit(resource.RLIMIT_DATA, memory_limit)
    # Python ignores SIGXFSZ: a larger write fails with EFBIG (where no tmpfs bounds the disk).
    _set_limit(resource.RLIMIT_FSIZE, disk_limit)
    _set_limit(resource.RLIMIT_NOFILE, DEFAULT_OPEN_FILES)
    _set_limit(resource.RLIMIT_CORE, 0)


def default_memory_limit() -> int:
    """Half the machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def private_dir(workdir: str) -> str:
    """The candidates' writable directory (HOME, TMPDIR, cwd) beneath the workdir."""
    return os.path.join(os.path.realpath(workdir), PRIVATE_DIR)


def apply(workdir: str, memory_limit: int, socket_dir: str | None = None,
          tcp_endpoint: bool = False, hide: tuple | list = (), disk_limit: int = DEFAULT_DISK_LIMIT,
          max_processes: int = 0) -> list[str]:
    """Applies every protection it can; returns the names of those in force.

    socket_dir: directory of an ipc:// endpoint, where the worker must create its socket.
    tcp_endpoint: the worker serves on TCP, so the network stays reachable (debugging).
    hide: directories and files candidates must not see (credentials, the node's state).
    """
    workdir = os.path.realpath(workdir)
    private = private_dir(workdir)
    os.makedirs(private, mode=0o700, exist_ok=True)
    max_processes = max_processes or default_max_processes()
    in_force: list[str] = []

    def attempt(name, fn):
        try:
            result = fn()
        except Exception as e:   # a protection the kernel refuses is reported, not fatal
            _log(f"{name} not in force: {e}")
            return False
        in_force.extend(result if isinstance(result, list) else [name])
        return True

    if tcp_endpoint:
        _log("netns and landlock-net not in force: the endpoint is TCP")
    if attempt("mountns", lambda: _enter_namespaces(network=tcp_endpoint)):
        attempt("disk", lambda: _private_tmpfs(private, disk_limit))
        if hide:
            blank = os.path.join(workdir, "hidden")
            needed = [workdir, sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(
                os.path.abspath(__file__)))] + [p for p in sys.path if p]
            if socket_dir:
                needed.append(os.path.realpath(socket_dir))

            def hide_all():
                with open(blank, "w"):
                    pass
                os.chmod(blank, 0)
                return ["hide"] if _hide(list(hide), needed, blank) else []
            attempt("hide", hide_all)
    elif not tcp_endpoint:
        attempt("netns", lambda: _enter_namespaces(network=False, mount=False))
    if not attempt("pids", lambda: _pids_cgroup(max_processes)):
        attempt("nproc", lambda: _nproc_limit(max_processes))
    attempt("cleanenv", lambda: clean_environment(private))
    attempt("rlimits", lambda: _rlimits(memory_limit, disk_limit))
    abi = landlock_abi()
    if abi == 0:
        _log("landlock not in force: the kernel does not support it")
    else:
        if tcp_endpoint:
            abi = min(abi, 3)
        socket_dirs = [os.path.realpath(socket_dir)] if socket_dir else []
        attempt("landlock", lambda: _landlock(abi, [private], socket_dirs, ["/dev/null"]))
    attempt("noprocs", _no_processes)
    # Last: the steps above need CAP_SYS_ADMIN when running as root.
    attempt("nocaps", _drop_capabilities)
    return in_force


@contextlib.contextmanager
def cpu_budget(seconds: int, interruptible=None):
    """CPU seconds (all threads) the body may use. RLIMIT_CPU counts the process's whole life,
    so the soft limit is moved to the time used so far plus `seconds`, and back to the hard
    limit afterwards. Past it the kernel sends SIGXCPU every CPU second; each one raises
    CpuLimitExceeded in the main thread while `interruptible()` is true (candidate code
    runs), and is let pass otherwise (the worker's own code, which must not be torn)."""
    if seconds <= 0:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    limit = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    if hard != resource.RLIM_INFINITY and limit >= hard:
        yield   # the hard limit ends the worker first; the C++ deadline covers the rest
        return

    def expired(signum, frame):
        if interruptible is None or interruptible():
            raise CpuLimitExceeded(f"used more than its {seconds} CPU seconds")

    previous = signal.signal(signal.SIGXCPU, expired)
    resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
        signal.signal(signal.SIGXCPU, previous)


def denial_message(exc: BaseException) -> str | None:
    """When exc is the sandbox refusing something (a write outside the workdir, a socket),
    a message saying so; None for any other exception."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.ENETUNREACH,
                                                       errno.EAFNOSUPPORT, errno.ECONNREFUSED,
                                                       errno.EHOSTUNREACH, errno.EROFS):
            what = f" {exc.filename}" if exc.filename else ""
            return f"refused by the sandbox:{what} {type(exc).__name__}: {exc.strerror or exc}"
        exc = exc.__cause__ or exc.__context__
    return None
