def create_inputs():
    return ()
