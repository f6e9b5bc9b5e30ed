// `maxkernel attach ENDPOINT`: a terminal shell on a hitl search's operator gateway
// (cluster/operator_gateway). It prints the gateway's events as stable lines and reads one
// line of input per waiting proposal, so a script on stdin stays in step with the proposals.
// docs/operator-gateway.md gives the output format.
#pragma once

#include "maxkernel/schema/operator.capnp.h"

#include <chrono>
#include <iosfwd>
#include <string>

namespace maxkernel::cli {

struct console_options {
  std::string endpoint;                    // ipc://PATH or tcp://HOST:PORT
  std::string name;                        // the operator's name; "" -> $USER, else "operator"
  double connect_timeout_seconds = 10;     // no welcome within it -> exit 3
  std::chrono::milliseconds ping_interval{1000};
  // Nothing heard from the gateway this long (it answers every ping) -> exit 3.
  std::chrono::milliseconds gateway_silence{10000};
  bool prompt = false;                     // print `decision #N> ` before reading (a TTY)
  std::string token_file;                  // a cluster's credentials (CURVE); "": none
};

// Runs until the search ends, the input ends (detaches) or `quit`: 0; 3 when the gateway
// does not answer (no welcome, or silent for `gateway_silence`); 2 for an endpoint ZeroMQ
// cannot use.
int run_console(const console_options& options, std::istream& in, std::ostream& out,
                std::ostream& err);

// run_console on stdin/stdout/stderr, with the prompt when stdin is a terminal.
int run_attach(console_options options);

// The lines the console prints for an event (without the trailing newline).
std::string format_event(schema::OperatorEvent::Reader event);

}  // namespace maxkernel::cli
