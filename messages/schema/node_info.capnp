# A TPU node (device) as the cluster registry sees it, and the worker pool behind it.
@0xab05280582e26d7c;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");

# One JAX worker of a pool.
struct WorkerState {
  index @0 :UInt32;
  state @1 :Text;             # starting | idle | busy | restarting
  pid @2 :Int64;              # 0 while no process runs
  restarts @3 :UInt32;        # restarts after a candidate crashed or hung the worker
  startFailures @4 :UInt32;   # failed starts since the last successful one
  lastError @5 :Text;         # why the latest start failed ("" when none did)
  retryInMs @6 :UInt64;       # restarting: the backoff before the next start attempt
  evaluations @7 :UInt64;     # jobs this worker finished
}

struct NodeInfo {
  schemaVersion @0 :UInt32;
  nodeId @1 :Text;            # "" in a pool's own NodeInfo
  host @2 :Text;
  chip @3 :Text;
  backend @4 :Text;           # model | jax-tpu
  device @5 :UInt32;
  workers @6 :UInt32;         # workers of the pool behind the node
  jaxVersion @7 :Text;        # "" until a worker has started
  maxkernelVersion @8 :Text;
  queueDepth @9 :UInt32;      # requests accepted and not finished (a pool: jobs queued)
  queueCapacity @10 :UInt32;  # beyond it a node refuses requests with `overloaded`
  workersBusy @11 :UInt32;
  workersIdle @12 :UInt32;
  workersRestarting @13 :UInt32;  # starting, or waiting out a backoff after a failed start
  evaluations @14 :UInt64;    # evaluations a worker ran (store hits excluded)
  cacheHits @15 :UInt64;      # requests answered from the evaluation store
  poolQueueDepth @16 :UInt32; # jobs waiting at the pool for a free worker, from all its nodes
  workerStates @17 :List(WorkerState);
  timeouts @18 :UInt64;       # requests answered with a timeout error
  refused @19 :UInt64;        # requests refused as overloaded
  simulatedDeviceMs @20 :UInt32;  # model backend: simulated device time per evaluation
  platform @21 :Text;         # JAX platform of the workers: cpu | tpu ("" until started)
  storePath @22 :Text;        # the evaluation store ("" without one)
}
