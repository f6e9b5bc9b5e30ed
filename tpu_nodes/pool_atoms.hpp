// Atoms of the messages inside a node process: a pool and its workers, a node's timers.
// They never cross hosts, so they are not part of messages/.
#pragma once

#include <caf/atom.hpp>

namespace maxkernel::tpu_nodes {

using start_atom = caf::atom_constant<caf::atom("start")>;      // worker: (re)start now
using ready_atom = caf::atom_constant<caf::atom("ready")>;      // worker -> pool: started
using down_atom = caf::atom_constant<caf::atom("wdown")>;       // worker -> pool: cannot start
using done_atom = caf::atom_constant<caf::atom("done")>;        // worker -> pool: job finished
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;  // node: a request's deadline
using release_atom = caf::atom_constant<caf::atom("release")>;  // node: simulated device done

}  // namespace maxkernel::tpu_nodes
