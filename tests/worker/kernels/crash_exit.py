# Ends the worker process outright.
import os


def workload(a, b):
    os._exit(3)
