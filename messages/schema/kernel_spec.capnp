# A kernel task, whichever of the three formats it came from.
@0xd8d75449a56d031d;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");
using import "common.capnp".TensorType;

enum SpecFormat {
  native @0;     # YAML file read by config/
  jaxbench @1;   # directory with baseline.py (CONFIG, create_inputs, workload)
  maxkernel @2;  # directory with kernel_task.yaml and reference.py
}

# How the values of one input are drawn.
struct Generator {
  union {
    normal @0 :Normal;
    uniform @1 :Uniform;
    randint @2 :Randint;
    code @3 :Text;      # Python source defining `generate(rng, shape, dtype, dims)`
    task @4 :Void;      # drawn by the task file's own code (create_inputs / get_inputs)
    zeros @5 :Void;
    ones @6 :Void;
  }
  struct Normal { mean @0 :Float64 = 0; std @1 :Float64 = 1; }
  struct Uniform { low @0 :Float64 = 0; high @1 :Float64 = 1; }
  struct Randint { low @0 :Int64 = 0; high @1 :Int64; }   # high exclusive
}

struct Input {
  name @0 :Text;
  type @1 :TensorType;        # empty shape and dtype "" for a static scalar argument
  generator @2 :Generator;
  isStatic @3 :Bool;          # a static (Python scalar) argument, not an array
  staticValue @4 :Text;       # JSON literal of a static argument
  structural @5 :Bool;        # integer input carrying structure (page table, group sizes, labels)
  dimNames @6 :List(Text);    # per axis: the named dimension it is ("" for a literal size)
}

# A named dimension of a native spec (M, K, N, ...); shapes refer to it by name.
struct NamedDim {
  name @0 :Text;
  size @1 :Int64;             # a derived dim: its value at the full sizes
  expression @2 :Text;        # "" for a literal size; else the integer expression over other
                              # dims it is derived from (MAX_SEQS + 1): + - * // ( ), names,
                              # integers. Reductions recompute it, never shrink it alone.
}

# One configuration of the task: its inputs and the reference's outputs.
struct Configuration {
  name @0 :Text;
  inputs @1 :List(Input);
  outputs @2 :List(TensorType);
}

struct Tolerance {
  output @0 :Int32 = -1;      # output index; -1 applies to every output
  atol @1 :Float64;
  rtol @2 :Float64;
}

# One file of a task directory, relative to the directory (also the files of a submission,
# messages/schema/submission.capnp).
struct TaskFile {
  path @0 :Text;               # relative to the task (a file name, or a path in its directory)
  data @1 :Data;
}

struct KernelSpec {
  schemaVersion @0 :UInt32;
  name @1 :Text;
  description @2 :Text;
  format @3 :SpecFormat;
  sourcePath @4 :Text;        # the spec file or task directory it came from (absolute)
  configurations @5 :List(Configuration);   # at least one; a kernel must pass them all
  reference @6 :Text;         # Python source of the reference module (baseline.py, reference.py)
  referenceEntry @7 :Text;    # function name: reference / workload / computation
  tolerances @8 :List(Tolerance);
  chip @9 :Text;              # target chip; the command line's --chip wins
  baselinePath @10 :Text;     # hand-tuned kernel file, "" without one
  configJson @11 :Text;       # JAXBench CONFIG as JSON ("" otherwise)
  flops @12 :Float64;         # from get_flops() when the task defines it; 0 unknown
  degenerate @13 :Bool;       # the reference's output barely depends on its inputs
  dims @14 :List(NamedDim);   # native specs: the named dimensions
  taskFiles @15 :List(TaskFile);  # a task directory's files, shipped with the work to nodes
                              # that do not share the supervisor's disk (docs/cluster.md);
                              # empty in one process: sourcePath is read where it is
}
