# Segfaults the worker process: reads a kernel-space address through ctypes.
import ctypes


def workload(a, b):
    return ctypes.string_at(0xFFFF800000001000, 8)
