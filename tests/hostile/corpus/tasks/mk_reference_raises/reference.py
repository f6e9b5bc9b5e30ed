def computation(x):
    raise ValueError('bad')
