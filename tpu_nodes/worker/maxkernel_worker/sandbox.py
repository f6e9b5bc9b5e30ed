"""The worker's sandbox, applied once at start, before jax (or any thread) exists.

Protections, each applied independently; one that the kernel refuses is left out of the
returned list (and logged) instead of stopping the worker:
  cleanenv        environment reduced to a whitelist; HOME, TMPDIR = the workdir
  netns           a private network namespace without interfaces (no network at all)
  nocaps          every capability dropped, bounding set included (root cannot setns back)
  landlock        file writes only beneath the workdir (plus /dev/null, the socket's directory)
  landlock-net    TCP bind and connect refused (Landlock ABI >= 4)
  landlock-scope  no abstract unix sockets or signals outside the sandbox (ABI >= 6)
  rlimits         data segment, file size, open files, no core dumps
Namespaces and Landlock act on the calling thread only, hence "before any thread".
"""

import ctypes
import errno
import os
import resource
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# x86_64 and aarch64 share these numbers (the Landlock syscalls are new and unified).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_SYS_CAPSET = 126 if os.uname().machine == "x86_64" else 91

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
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

DEFAULT_FILE_SIZE_LIMIT = 4 << 30
DEFAULT_OPEN_FILES = 4096


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


def _enter_network_namespace() -> None:
    if os.geteuid() == 0:
        if _libc.unshare(_CLONE_NEWNET) != 0:
            raise OSError(f"unshare(CLONE_NEWNET): {_errno_text()}")
        return
    # Unprivileged: a user namespace first, mapping our ids to themselves so files we
    # create keep their owner.
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        raise OSError(f"unshare(CLONE_NEWUSER|CLONE_NEWNET): {_errno_text()}")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


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


def _set_limit(which: int, value: int) -> None:
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value if hard == resource.RLIM_INFINITY else hard))


def _rlimits(memory_limit: int) -> None:
    # RLIMIT_DATA, not RLIMIT_AS: XLA reserves far more address space than it touches.
    _set_limit(resource.RLIMIT_DATA, memory_limit)
    _set_limit(resource.RLIMIT_FSIZE, DEFAULT_FILE_SIZE_LIMIT)
    _set_limit(resource.RLIMIT_NOFILE, DEFAULT_OPEN_FILES)
    _set_limit(resource.RLIMIT_CORE, 0)


def default_memory_limit() -> int:
    """Half the machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def apply(workdir: str, memory_limit: int, socket_dir: str | None = None,
          tcp_endpoint: bool = False) -> list[str]:
    """Applies every protection it can; returns the names of those in force.

    socket_dir: directory of an ipc:// endpoint, where the worker must create its socket.
    tcp_endpoint: the worker serves on TCP, so the network stays reachable (debugging).
    """
    workdir = os.path.realpath(workdir)
    in_force: list[str] = []

    def attempt(name, fn):
        try:
            result = fn()
        except Exception as e:   # a protection the kernel refuses is reported, not fatal
            _log(f"{name} not in force: {e}")
            return
        in_force.extend(result if isinstance(result, list) else [name])

    attempt("cleanenv", lambda: clean_environment(workdir))
    if tcp_endpoint:
        _log("netns and landlock-net not in force: the endpoint is TCP")
    else:
        attempt("netns", _enter_network_namespace)
    attempt("rlimits", lambda: _rlimits(memory_limit))
    abi = landlock_abi()
    if abi == 0:
        _log("landlock not in force: the kernel does not support it")
    else:
        if tcp_endpoint:
            abi = min(abi, 3)
        socket_dirs = [os.path.realpath(socket_dir)] if socket_dir else []
        attempt("landlock", lambda: _landlock(abi, [workdir], socket_dirs, ["/dev/null"]))
    # Last: the steps above need CAP_SYS_ADMIN when running as root.
    attempt("nocaps", _drop_capabilities)
    return in_force


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
