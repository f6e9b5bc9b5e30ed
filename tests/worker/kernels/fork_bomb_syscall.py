# Sandbox: a fork bomb by raw fork(2), through a libc function the worker resolved before the
# candidate ran (its own ctypes handle), so no audit event sees it: the kernel's seccomp
# filter must refuse it (and the pids cgroup would bound it).
import os

from maxkernel_worker import sandbox

SYS_FORK = 57 if os.uname().machine == "x86_64" else 220   # aarch64: clone(SIGCHLD)


def workload(a, b):
    while True:
        sandbox._libc.syscall(SYS_FORK, 17, 0, 0, 0, 0)
