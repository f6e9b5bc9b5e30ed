# Time and hardware profile of one kernel on one chip, modeled or measured.
@0xf24efe093cef5bf7;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");

enum Timing { modeled @0; measured @1; }

# HBM traffic of one pallas_call operand over the whole grid.
struct OperandTraffic {
  role @0 :Text;              # input, output, scalarPrefetch
  index @1 :UInt32;
  copies @2 :Float64;         # block copies (inputs) or write-backs (outputs)
  bytes @3 :Float64;
}

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
  dmaUs @9 :Float64;          # all copies, overlapped or not
  exposedDmaUs @10 :Float64;  # copy time not hidden behind compute
  mxuUtilization @11 :Float64;
  steps @12 :Float64;         # grid steps per TensorCore
  coresUsed @13 :UInt32;
  traffic @14 :List(OperandTraffic);
  count @15 :Float64;         # times the call runs
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
  computeUs @11 :Float64;
  dmaUs @12 :Float64;
  exposedDmaUs @13 :Float64;
  overheadUs @14 :Float64;
  outsideUs @15 :Float64;     # work outside the pallas_calls, priced as XLA fusions
  mxuUtilization @16 :Float64;
  hbmBandwidth @17 :Float64;  # achieved B/s
  arithmeticIntensity @18 :Float64;  # flops per HBM byte
  vmemPeakBytes @19 :Int64;
  vmemLimitBytes @20 :Int64;
  backend @21 :Text;          # model | jax-tpu
  unmodeled @22 :List(Text);  # what the model could not represent (and priced as zero)
}
