# A kernel that never returns: check reports it as the candidate's timeout (exit 1).
import time


def workload(x, y):
    while True:
        time.sleep(1)
