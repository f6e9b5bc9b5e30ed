def workload(x):
    return x  # café
