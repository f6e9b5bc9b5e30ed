# Sandbox: fills its writable directory until the disk is full.
import os


def workload(a, b):
    chunk = b"\0" * (1 << 20)
    i = 0
    while True:
        with open(os.path.join(os.getcwd(), f"fill-{i}.bin"), "wb") as f:
            for _ in range(64):
                f.write(chunk)
        i += 1
