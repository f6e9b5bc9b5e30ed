# Types shared by every maxkernel schema.
@0xf7df1a8e9655b919;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");

# Bumped whenever a change to any schema is not backward compatible; every top-level
# message carries it so that a reader can refuse data from another version.
const schemaVersion :UInt32 = 1;

# Shape and dtype of an array. dtype uses numpy/JAX names: "bfloat16", "float32", "int32", ...
struct TensorType {
  shape @0 :List(Int64);
  dtype @1 :Text;
}
