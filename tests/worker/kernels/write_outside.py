# Sandbox: tries to write a file outside its private working directory.
def workload(a, b):
    with open("/tmp/maxkernel_candidate_was_here", "w") as f:
        f.write("x")
    return a @ b
