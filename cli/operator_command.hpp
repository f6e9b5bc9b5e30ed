// One line typed at `maxkernel attach`: a decision on the waiting proposal (approve, reject,
// edit, edit-source, hint, takeover, handover, stop) or a command to the console itself
// (show, help, quit). docs/operator-gateway.md lists them.
#pragma once

#include "maxkernel/schema/operator.capnp.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace maxkernel::cli {

struct operator_command {
  // none: a blank or # comment line; release: give up the hitl floor
  enum class action { none, decide, show, help, quit, release };
  action what = action::none;
  schema::DecisionKind kind = schema::DecisionKind::APPROVE;
  std::string text;                                          // reject: feedback; hint
  std::vector<std::pair<std::string, std::string>> changes;  // edit: name -> JSON literal
  std::string source;                                        // edit-source, takeover
  std::string source_file;                                   // the file `source` came from
  uint32_t steps = 0;                                        // handover
};

struct parsed_operator_command {
  bool ok = false;
  operator_command command;
  std::string error;  // when !ok: what is wrong with the line, naming the field or file
};

// Never throws; a file named by edit-source or takeover is read here.
parsed_operator_command parse_operator_command(const std::string& line);

// The OperatorCommand{decision} answering proposal `seq`, encoded for the gateway. The
// operator's name is left to the gateway (it knows the shell's attach name).
std::string encode_decision(const operator_command& command, uint32_t seq);

const char* operator_command_help();

}  // namespace maxkernel::cli
