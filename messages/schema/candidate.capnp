# A candidate kernel: Pallas source, its parameters and where it came from.
@0x95c3faa9558c7aea;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");

struct Param {
  name @0 :Text;
  value @1 :Text;             # JSON literal
}

struct Candidate {
  schemaVersion @0 :UInt32;
  id @1 :Text;                # content hash of source and params (hex sha256)
  source @2 :Text;            # the Python module defining workload(*inputs)
  params @3 :List(Param);
  parentId @4 :Text;          # "" for a root
  strategy @5 :Text;          # the strategy that produced it from the parent
  origin @6 :Text;            # file path, brain, or operator that wrote it
  template @7 :Text;          # the expert template it was rendered from; "" otherwise
}
