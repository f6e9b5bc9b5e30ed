# Time and hardware profile of one kernel on one chip, modeled or measured.
@0xf24efe093cef5bf7;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");

enum Timing { modeled @0; measured @1; }

struct CallProfile {
  name @0 :Text;
  timeUs @1 :Float64;
  computeUs @2 :Float64;
  memoryUs @3 :Float64;
  overheadUs @4 :Float64;
  flops @5 :Float64;
  hbmBytes @6 :Float64;
  vmemBytes @7 :Int64;
  bound @8 :Text;             # compute, memory, overhead, latency
}

struct Profile {
  schemaVersion @0 :UInt32;
  timing @1 :Timing;
  chip @2 :Text;
  timeUs @3 :Float64;
  rooflineUs @4 :Float64;
  flops @5 :Float64;
  hbmBytes @6 :Float64;
  bound @7 :Text;
  calls @8 :List(CallProfile);
  notes @9 :List(Text);
  runs @10 :List(Float64);    # measured: each run's time
}
