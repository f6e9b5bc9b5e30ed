# The protocol between a C++ worker client and the Python JAX worker, over ZeroMQ.
# One request in flight per worker; the reply carries the request's id.
@0xbed437ee5a2bcb93;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");
using import "kernel_spec.capnp".KernelSpec;
using import "kernel_spec.capnp".TaskFile;
using import "kernel_structure.capnp".DataflowGraph;
using import "eval.capnp".EvalRequest;
using import "eval.capnp".EvalResult;
using import "eval.capnp".PhaseResult;

struct LoadRequest {
  path @0 :Text;              # a JAXBench or MaxKernel task directory
  memoryLimitBytes @1 :UInt64;  # refuse tasks whose inputs exceed this; 0 = worker default
  taskFiles @2 :List(TaskFile); # the directory's files, for a node that cannot read `path`:
                              # it writes them into a directory of its own and loads that
}

struct AnalyzeRequest {
  spec @0 :KernelSpec;
  configuration @1 :UInt32;
}

struct WorkerRequest {
  id @0 :UInt64;
  union {
    ping @1 :Void;
    load @2 :LoadRequest;
    analyze @3 :AnalyzeRequest;
    lower @4 :EvalRequest;     # load + lower the candidate for TPU
    extract @5 :EvalRequest;   # load + trace: the candidate's KernelStructure
    test @6 :EvalRequest;      # load + run in TPU interpret mode against the reference
    time @7 :EvalRequest;      # real TPU only: median device time
    shutdown @8 :Void;
  }
}

struct WorkerInfo {
  pid @0 :Int64;
  jaxVersion @1 :Text;
  platform @2 :Text;          # cpu | tpu
  devices @3 :UInt32;
  sandbox @4 :List(Text);     # protections in force: netns, landlock, rlimits, cleanenv
}

struct WorkerReply {
  id @0 :UInt64;
  union {
    pong @1 :WorkerInfo;
    spec @2 :KernelSpec;
    graph @3 :DataflowGraph;
    eval @4 :EvalResult;
    error @5 :PhaseResult;    # the request itself failed (bad spec, internal error)
  }
}
