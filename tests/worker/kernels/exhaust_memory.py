# Sandbox: allocates (and touches) memory until there is none left.
def workload(a, b):
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))
