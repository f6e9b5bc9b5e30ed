#include "cli/cluster_client.hpp"

#include "cli/client_event.hpp"
#include "cli/operator_console.hpp"
#include "cli/output_file.hpp"
#include "maxkernel/schema/submission.capnp.h"
#include "messages/payload_codec.hpp"

#include <chrono>
#include <iostream>
#include <thread>

#include <unistd.h>

namespace maxkernel::cli {

int run_cluster_status(const cluster_client_options& client) {
  cluster_connection conn;
  if (int code = conn.open(client, std::cerr))
    return code;
  try {
    conn.send(status_request());
    auto bytes = conn.receive(
      std::chrono::milliseconds(static_cast<int64_t>(client.silence_seconds * 1000)));
    if (!bytes) {
      std::cerr << no_answer_message(client, false);
      return 3;
    }
    std::string error;
    auto msg = read_client_event(*bytes, error);
    if (!msg || msg->root<schema::ClientEvent>().which() != schema::ClientEvent::STATUS) {
      std::cerr << "error: the supervisor sent no status" << (error.empty() ? "" : ": " + error)
                << "\n";
      return 3;
    }
    std::cout << msg->root<schema::ClientEvent>().getStatus().cStr();
    return 0;
  } catch (const kj::Exception& e) {
    std::cerr << "error: the supervisor sent a malformed event: " << e.getDescription().cStr()
              << "\n";
    return 3;
  }
}

int run_cluster_optimize(const optimize_options& opts, const std::vector<std::string>& args,
                         const cluster_client_options& client) {
  std::string error;
  if (!opts.out.empty() && !make_output_dir(opts.out, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  if (!output_dir_exists(opts.json, error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  auto submit = submit_request(opts.spec, args, !opts.out.empty(), opts.out, error);
  if (submit.empty()) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  cluster_connection conn;
  if (int code = conn.open(client, std::cerr))
    return code;
  std::thread console;
  struct leave {
    std::thread& t;
    ~leave() {
      if (t.joinable())
        t.detach();  // an error ends the client; the console's reader may still block
    }
  } on_exit{console};
  try {
    conn.send(submit);
    auto silence = std::chrono::milliseconds(static_cast<int64_t>(client.silence_seconds * 1000));
    auto last_word = std::chrono::steady_clock::now();
    auto last_ping = last_word;
    bool heard = false;
    for (;;) {
      auto bytes = conn.receive(std::chrono::milliseconds(200));
      if (!bytes) {
        auto now = std::chrono::steady_clock::now();
        if (now - last_word > silence) {
          std::cerr << no_answer_message(client, heard);
          return 3;
        }
        // The run may print nothing for minutes; a status request shows the supervisor lives.
        if (now - last_ping > silence / 3) {
          conn.send(status_request());
          last_ping = now;
        }
        continue;
      }
      heard = true;
      last_word = std::chrono::steady_clock::now();
      auto msg = read_client_event(*bytes, error);
      if (!msg) {
        std::cerr << "error: the supervisor sent a malformed event: " << error << "\n";
        return 3;
      }
      auto e = msg->root<schema::ClientEvent>();
      switch (e.which()) {
        case schema::ClientEvent::OUTPUT: {
          std::string text = e.getOutput().getText().cStr();
          // --console: this terminal attaches to the run's operator gateway, as embedded.
          auto at = text.find("operator gateway: ");
          if (opts.console && !console.joinable() && at != std::string::npos) {
            console_options co;
            co.endpoint = text.substr(at + 18, text.find(' ', at + 18) - at - 18);
            co.token_file = client.token_file;
            co.prompt = ::isatty(STDIN_FILENO) == 1;
            console = std::thread([co] { run_console(co, std::cin, std::cout, std::cerr); });
          }
          bool to_stdout = e.getOutput().getStream() == 1 && opts.json != "-";
          (to_stdout ? std::cout : std::cerr) << text << std::flush;  // stdout may carry JSON
          break;
        }
        case schema::ClientEvent::STATUS:
        case schema::ClientEvent::REPLY:
          break;  // signs of life
        case schema::ClientEvent::REFUSED:
          std::cerr << "error: the supervisor refused the task: " << e.getRefused().cStr() << "\n";
          return 2;
        case schema::ClientEvent::FINISHED: {
          auto f = e.getFinished();
          if (console.joinable())
            console.join();  // it leaves on the gateway's `ended`
          if (!opts.out.empty() && f.getFiles().size() > 0
              && !write_task_files(opts.out, f.getFiles(), error)) {
            std::cerr << "error: " << error << "\n";
            return 3;
          }
          if (!opts.json.empty() && f.getJson().size() > 0
              && !write_output(opts.json, f.getJson().cStr(), error)) {
            std::cerr << "error: " << error << "\n";
            return 3;
          }
          return f.getExitCode();
        }
      }
    }
  } catch (const kj::Exception& e) {
    std::cerr << "error: the supervisor sent a malformed event: " << e.getDescription().cStr()
              << "\n";
    return 3;
  }
}

}  // namespace maxkernel::cli
