def computation(x):
    while True:
        pass
