"""The request loop: one WorkerRequest in, one WorkerReply out, over a ZeroMQ REP socket.

Nothing a request carries ends the worker: candidate failures become failed phases of an
EvalResult, request-level failures (a bad spec, undecodable bytes, a bug of ours) an `error`
reply. Deadlines are the C++ client's business: it kills and restarts a worker that does
not answer in time (a hanging kernel) or dies (os._exit, a segfault).
"""

import os
import shutil
import sys
import time
import traceback

import jax
import zmq

from . import candidate as candidate_mod
from . import lowering, sandbox, tester, timing
from .errors import WorkerError
from .task import load_task_dir, open_task

MAX_MESSAGE = 4000


def _first_line_kj(text: str) -> str:
    # pycapnp's KjException text carries a native stack dump after the message.
    return text.split("\nstack:")[0]


class _Eval:
    """Builds one EvalResult dict phase by phase."""

    def __init__(self, schema_version: int, candidate_id: str):
        self.result = {"schemaVersion": schema_version, "candidateId": candidate_id,
                       "phases": [], "correct": False, "hasStructure": False,
                       "hasProfile": False}
        self.failed = False

    def phase(self, name: str, start: float, error: WorkerError | None = None):
        entry = {"phase": name, "status": "ok", "errorClass": "none", "message": "",
                 "seconds": time.perf_counter() - start}
        if error is not None:
            entry.update(status="failed", errorClass=error.error_class,
                         message=error.message[:MAX_MESSAGE])
            self.failed = True
        self.result["phases"].append(entry)

    def skipped(self, name: str, why: str):
        self.result["phases"].append({"phase": name, "status": "skipped", "errorClass": "none",
                                      "message": why, "seconds": 0.0})


class Server:
    def __init__(self, schemas, workdir: str, memory_limit: int, sandbox: list[str],
                 cpu_limit: int = 0):
        self.s = schemas
        self.workdir = workdir
        self.memory_limit = memory_limit
        self.sandbox = sandbox
        self.cpu_limit = cpu_limit   # CPU seconds per evaluation request; 0: none
        self.stopping = False

    # ------------------------------------------------------------------ the loop
    def serve(self, endpoint: str) -> None:
        context = zmq.Context.instance()
        socket = context.socket(zmq.REP)
        socket.setsockopt(zmq.LINGER, 1000)
        socket.bind(endpoint)
        print(f"maxkernel_worker: serving on {endpoint} (pid {os.getpid()}, sandbox: "
              f"{', '.join(self.sandbox) or 'none'})", file=sys.stderr, flush=True)
        try:
            while not self.stopping:
                data = socket.recv()
                socket.send(self.handle(data))
        finally:
            socket.close()

    def handle(self, data: bytes) -> bytes:
        """Reply bytes for request bytes; never raises."""
        try:
            reader = self.s.WorkerRequest.from_bytes(data, traversal_limit_in_words=1 << 32)
            req = reader.__enter__()
            request_id, kind = req.id, req.which()
        except Exception as e:   # undecodable bytes: bad input from the client
            return self._error(0, "badInput", "the request is not a WorkerRequest: "
                               + _first_line_kj(str(e)))
        try:
            return self._dispatch(req, kind).to_bytes()
        except WorkerError as e:
            return self._error(request_id, e.error_class, e.message)
        except sandbox.CpuLimitExceeded as e:   # past the budget outside candidate code
            return self._error(request_id, "resourceLimit", f"the request {e}")
        except MemoryError as e:   # the data segment limit, outside candidate code
            return self._error(request_id, "resourceLimit", f"out of memory: {e}")
        except Exception as e:   # a bug of ours (or of task code we did not foresee)
            return self._error(request_id, "internal",
                               f"{type(e).__name__}: {_first_line_kj(str(e))}\n"
                               + "".join(traceback.format_exc(limit=-6)))
        except BaseException as e:   # SystemExit from task code: still an answer
            if isinstance(e, KeyboardInterrupt):
                raise
            return self._error(request_id, "internal", f"{type(e).__name__}: {e}")
        finally:
            reader.__exit__(None, None, None)

    def _error(self, request_id: int, error_class: str, message: str) -> bytes:
        reply = self.s.WorkerReply.new_message(id=request_id, error={
            "phase": "load", "status": "failed", "errorClass": error_class,
            "message": message[:MAX_MESSAGE], "seconds": 0.0})
        return reply.to_bytes()

    def _reply(self, request_id: int, **union):
        return self.s.WorkerReply.new_message(id=request_id, **union)

    def _dispatch(self, req, kind: str):
        if kind == "ping":
            return self._reply(req.id, pong=self.info())
        if kind == "shutdown":
            self.stopping = True
            return self._reply(req.id, pong=self.info())
        if kind == "load":
            limit = req.load.memoryLimitBytes or self.memory_limit
            spec = load_task_dir(req.load.path, limit)
            return self._reply(req.id, spec=spec)
        if kind == "analyze":
            return self._reply(req.id, graph=self.analyze(req.analyze))
        if kind in ("lower", "extract", "test", "time"):
            try:
                # Interrupts candidate code only (tester's guard is up while it runs).
                with sandbox.cpu_budget(self.cpu_limit, lambda: tester._active is not None):
                    result = self.evaluate(kind, getattr(req, kind))
            finally:
                self._clean_private_dir()
            return self._reply(req.id, eval=result)
        raise WorkerError("badInput", f"unknown request kind {kind!r}")

    def _clean_private_dir(self) -> None:
        """Removes what candidates left in the private directory (a full one would fail the
        next candidate's load), keeping the source files of the loaded candidates."""
        keep = {c.path for c in candidate_mod._cache.values()}
        try:
            entries = [os.path.join(self.workdir, e) for e in os.listdir(self.workdir)]
            candidates = os.path.join(self.workdir, "candidates")
            if os.path.isdir(candidates) and not os.path.islink(candidates):
                entries.remove(candidates)
                entries += [os.path.join(candidates, e) for e in os.listdir(candidates)]
        except OSError:
            return
        for path in entries:
            if path in keep:
                continue
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
            except OSError:
                pass

    # ------------------------------------------------------------------ requests
    def info(self) -> dict:
        devices = jax.devices()
        return {"pid": os.getpid(), "jaxVersion": jax.__version__,
                "platform": devices[0].platform, "devices": len(devices),
                "sandbox": list(self.sandbox)}

    def analyze(self, request) -> dict:
        from .analyze import analyze
        task = open_task(request.spec)
        c = request.configuration
        if c >= task.num_configurations:
            raise WorkerError("badInput", f"task {task.name}: configuration {c} out of range "
                                          f"(it has {task.num_configurations})")
        return analyze(task.reference(c), task.abstract_args(c), task.static_argnums(c))

    def evaluate(self, kind: str, request) -> dict:
        spec = request.spec.to_dict()
        options = request.options.to_dict()
        chip = options.get("chip") or spec.get("chip", "")
        ev = _Eval(self.s.schema_version, request.candidate.id)
        task = open_task(spec)   # a bad spec is a request-level error (badInput)
        # Which configuration extract and time work on; lower and test cover all of them.
        configuration = int(options.get("configuration", 0))
        if kind in ("extract", "time") and configuration >= task.num_configurations:
            raise WorkerError("badInput", f"task {task.name}: options.configuration {configuration} "
                                          f"is out of range (the spec has {task.num_configurations} "
                                          f"configuration{'s' if task.num_configurations != 1 else ''})")
        files, dirs = tester.forbidden_for(task, spec)

        start = time.perf_counter()
        try:
            with tester.guard(files, dirs):
                cand = candidate_mod.load_candidate(request.candidate, self.workdir)
        except WorkerError as e:
            candidate_mod.forget(request.candidate.id)
            ev.phase("load", start, e)
            return ev.result
        ev.phase("load", start)

        if kind == "lower":
            start = time.perf_counter()
            error = None
            for c in range(task.num_configurations):
                abstract, static = task.abstract_args(c), task.static_argnums(c)   # task errors: badInput
                error = self._candidate_step(
                    cand, files, dirs, "lowerError",
                    lambda: lowering.lower(cand.workload, abstract, static, chip))
                if error:
                    if task.num_configurations > 1:
                        error.message = f"configuration {c}: {error.message}"
                    break
            ev.phase("lower", start, error)
        elif kind == "extract":
            self._extract(ev, cand, task, files, dirs, configuration)
        elif kind == "test":
            start = time.perf_counter()
            report, failure = tester.run_tests(cand, task, spec, options)
            ev.result["test"] = report
            if isinstance(failure, tester.Skipped):
                # Nothing was checked (the reference disallows the tester's inputs): neither
                # passed nor failed, and correctness is not claimed.
                ev.skipped("test", failure.message)
                ev.result["correct"] = False
            else:
                ev.phase("test", start, failure)
                ev.result["correct"] = not ev.failed
        elif kind == "time":
            self._time(ev, cand, task, files, dirs, options, chip, configuration)
        return ev.result

    def _candidate_step(self, cand, files, dirs, default_class: str, fn):
        """Runs candidate code under the guard; the WorkerError it failed with, or None."""
        try:
            with tester.guard(files, dirs):
                fn()
        except WorkerError as e:
            if e.error_class == "traceError" and e.__cause__ is not None:
                where = candidate_mod.innermost_location(e.__cause__, cand)
                if where and not e.message.startswith(where):
                    e.message = f"{where}: {e.message}"
            return e
        except BaseException as e:   # SystemExit too: candidate code never ends the worker
            if isinstance(e, KeyboardInterrupt):
                raise
            return tester.classify_candidate_exception(e, cand, default_class)
        return None

    def _extract(self, ev, cand, task, files, dirs, c: int):
        """The structure of configuration c (the performance model's input). A failure here
        is reported on the profile phase: without a structure there is no modeled profile."""
        from .extract import extract
        start = time.perf_counter()
        out = {}

        def run():
            out["structure"] = extract(cand.workload, task.abstract_args(c), task.static_argnums(c),
                                       concrete_args=lambda: tester.unguarded(task.prefetch_args, c, 0))
        error = self._candidate_step(cand, files, dirs, "traceError", run)
        if error:
            error.message = f"extracting the kernel's structure: {error.message}"
            ev.phase("profile", start, error)
            return
        structure = dict(out["structure"])
        structure.setdefault("schemaVersion", self.s.schema_version)
        ev.result["structure"] = structure
        ev.result["hasStructure"] = True

    def _time(self, ev, cand, task, files, dirs, options, chip, c: int):
        start = time.perf_counter()
        if timing.platform() != "tpu":
            ev.phase("profile", start, WorkerError(
                "badInput", f"no TPU is present on this worker (JAX platform "
                            f"{timing.platform()}): measured timing needs the jax-tpu backend"))
            return
        out = {}
        args = task.make_args(c, 0)   # outside the guard: task code lives in fenced-off files

        def run():
            out["profile"] = timing.time_candidate(
                cand.workload, args, task.static_argnums(c), int(options.get("timeRuns", 10)),
                int(options.get("warmupRuns", 3)), chip)
        error = self._candidate_step(cand, files, dirs, "runtimeError", run)
        if error:
            ev.phase("profile", start, error)
            return
        profile = out["profile"]
        profile["schemaVersion"] = self.s.schema_version
        ev.result["profile"] = profile
        ev.result["hasProfile"] = True
        ev.phase("profile", start)
