# Does not load: a syntax error on line 3.
def workload(a, b)
    return a @ b
