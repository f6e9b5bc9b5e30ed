# Sandbox: spins on the CPU forever (no sleep, unlike hang.py): the CPU budget ends it.
def workload(a, b):
    n = 0
    while True:
        n += 1
