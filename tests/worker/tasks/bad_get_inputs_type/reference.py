def computation(x):
    return x
