# Calls sys.exit while tracing: a failed phase, never the end of the worker.
import sys


def workload(a, b):
    sys.exit(0)
