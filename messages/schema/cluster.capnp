# The cluster's messages (cluster/, docs/modes.md): what the dispatcher in front of the TPU
# nodes reports about its work.
@0x96458b34812009d1;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");

struct NodeLoad {
  index @0 :UInt32;            # the node's position in the dispatcher's set (join order)
  nodeId @1 :Text;             # "" until the node described itself
  inFlight @2 :UInt32;         # requests sent to it and not answered
  credits @3 :UInt32;          # requests it may hold at once
  completed @4 :UInt64;
  alive @5 :Bool;              # false once it went down (its work went elsewhere)
  draining @6 :Bool;           # finishes what it holds, gets no more work
  chip @7 :Text;               # as announced at its join ("" : not said; it takes any chip)
  backend @8 :Text;            # model | jax-tpu ("" : not said)
}

struct DispatcherStatus {
  schemaVersion @0 :UInt32;
  nodes @1 :List(NodeLoad);
  queued @2 :UInt32;           # requests waiting for a free credit
  inFlight @3 :UInt32;         # distinct requests out at nodes (a duplicate counts once)
  completed @4 :UInt64;
  redispatched @5 :UInt64;     # straggler copies sent to an idle node
  requeued @6 :UInt64;         # requests moved after a node refused (overloaded) or went down
  nodesLost @7 :UInt64;        # times a node was taken as lost (down, or unreachable)
  orphaned @8 :UInt64;         # requests in flight at a lost node, dispatched again elsewhere
}
