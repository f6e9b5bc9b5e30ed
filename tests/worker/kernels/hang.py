# Never returns: the C++ client's deadline (or the test's) must end it.
def workload(a, b):
    while True:
        pass
