# Does not load: a syntax error on line 2 (no colon).
def workload(a, b)
    return a @ b
