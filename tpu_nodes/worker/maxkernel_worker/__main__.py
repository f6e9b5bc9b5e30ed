"""Entry point: parse arguments, apply the sandbox, then import jax and serve."""

import argparse
import os
import sys


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m maxkernel_worker",
                                description="maxkernel's sandboxed JAX worker (ZeroMQ REP server)")
    p.add_argument("--endpoint", required=True,
                   help="ZeroMQ endpoint to bind, e.g. ipc:///tmp/w/worker.sock")
    p.add_argument("--schema-dir", required=True, help="directory of the *.capnp schemas")
    p.add_argument("--workdir", required=True,
                   help="private working directory: the only place the worker may write")
    p.add_argument("--memory-limit", type=int, default=0, metavar="BYTES",
                   help="data segment limit, and the default input-size limit of load "
                        "requests (default: half the physical memory)")
    p.add_argument("--hide", action="append", default=[], metavar="PATH",
                   help="a directory or file candidates must not see (the cluster token, the "
                        "node's state); repeatable")
    p.add_argument("--disk-limit", type=int, default=0, metavar="BYTES",
                   help="size of the private directory, the only writable place (default 1 GiB)")
    p.add_argument("--cpu-limit", type=int, default=-1, metavar="SECONDS",
                   help="CPU seconds one evaluation request may use, all threads together "
                        "(default 3600; 0: no limit)")
    p.add_argument("--max-processes", type=int, default=0, metavar="N",
                   help="tasks (processes and threads) the worker may have (default "
                        "max(1024, 8 per core))")
    p.add_argument("--no-sandbox", action="store_true",
                   help="debugging only: no namespace, Landlock, rlimits or env cleaning")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    # Absolute before the sandbox moves the working directory to the workdir.
    workdir = os.path.realpath(args.workdir)
    args.schema_dir = os.path.abspath(args.schema_dir)
    if not os.path.isdir(workdir):
        print(f"maxkernel_worker: --workdir {args.workdir}: not a directory", file=sys.stderr)
        return 2
    if not os.path.isdir(args.schema_dir):
        print(f"maxkernel_worker: --schema-dir {args.schema_dir}: not a directory", file=sys.stderr)
        return 2
    if args.memory_limit < 0:
        print(f"maxkernel_worker: --memory-limit {args.memory_limit}: must be positive",
              file=sys.stderr)
        return 2
    for name in ("disk_limit", "max_processes"):
        if getattr(args, name) < 0:
            print(f"maxkernel_worker: --{name.replace('_', '-')} {getattr(args, name)}: must be "
                  f"positive", file=sys.stderr)
            return 2
    from . import sandbox   # ctypes only: safe before the sandbox
    cpu_limit = sandbox.DEFAULT_CPU_SECONDS if args.cpu_limit < 0 else args.cpu_limit
    memory_limit = args.memory_limit or sandbox.default_memory_limit()
    endpoint = args.endpoint
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc:///"):
        endpoint = "ipc://" + os.path.abspath(endpoint[len("ipc://"):])
    in_force = []
    private = sandbox.private_dir(workdir)
    if args.no_sandbox:
        os.makedirs(private, exist_ok=True)
        os.chdir(private)
        print("maxkernel_worker: --no-sandbox: running unprotected", file=sys.stderr, flush=True)
    else:
        socket_dir = None
        if endpoint.startswith("ipc://"):
            socket_dir = os.path.dirname(os.path.abspath(endpoint[len("ipc://"):]))
        # Before jax and zmq: namespaces and Landlock bind the calling thread only.
        in_force = sandbox.apply(workdir, memory_limit, socket_dir=socket_dir,
                                 tcp_endpoint=endpoint.startswith("tcp://"), hide=args.hide,
                                 disk_limit=args.disk_limit or sandbox.DEFAULT_DISK_LIMIT,
                                 max_processes=args.max_processes)

    from . import jax_compat
    from .schema import load_schemas
    from .server import Server
    if not jax_compat.apply():   # fixes to JAX 0.10.2's TPU interpret mode (see the module)
        print(f"maxkernel_worker: JAX is not {jax_compat.PINNED_JAX}: interpret-mode shims "
              f"not applied", file=sys.stderr, flush=True)
    try:
        schemas = load_schemas(args.schema_dir)
    except Exception as e:
        print(f"maxkernel_worker: --schema-dir {args.schema_dir}: {e}", file=sys.stderr)
        return 2
    server = Server(schemas, private, memory_limit, in_force, cpu_limit=cpu_limit)
    try:
        server.serve(endpoint)
    except KeyboardInterrupt:
        return 0
    except Exception as e:   # the endpoint cannot be bound: an environment error
        print(f"maxkernel_worker: --endpoint {endpoint}: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
