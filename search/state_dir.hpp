// Where maxkernel keeps state that outlives a run (the evaluation store), per the XDG base
// directory spec: state, not cache, since losing it loses paid-for evaluations.
#pragma once

#include <string>

namespace maxkernel::search {

// $MAXKERNEL_STATE_DIR, else $XDG_STATE_HOME/maxkernel, else $HOME/.local/state/maxkernel
// (the home from the password database when HOME is unset); "" when there is no home at all.
std::string default_state_dir();
// The evaluation store's file in state_dir.
std::string default_store_path(const std::string& state_dir);

}  // namespace maxkernel::search
