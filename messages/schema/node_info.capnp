# A TPU node (device) as the cluster registry sees it.
@0xab05280582e26d7c;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");

struct NodeInfo {
  schemaVersion @0 :UInt32;
  nodeId @1 :Text;
  host @2 :Text;
  chip @3 :Text;
  backend @4 :Text;           # model | jax-tpu
  device @5 :UInt32;
  workers @6 :UInt32;
  jaxVersion @7 :Text;
  maxkernelVersion @8 :Text;
}
