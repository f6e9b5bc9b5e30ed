def computation(x):
    return x * 2
