// A frame from a cluster's supervisor, read as `optimize --cluster` and `cluster status`
// read it (cli/client_event): the event checked, then the fields the client reads, and the
// paths of the files it would write checked as write_task_files checks them.
#include "cli/client_event.hpp"
#include "cli/task_path.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace maxkernel;
  std::string error;
  auto msg = cli::read_client_event(std::string(reinterpret_cast<const char*>(data), size), error);
  if (!msg)
    return 0;
  auto e = msg->root<schema::ClientEvent>();
  switch (e.which()) {
    case schema::ClientEvent::OUTPUT: {
      std::string text = e.getOutput().getText().cStr();
      auto at = text.find("operator gateway: ");
      if (at != std::string::npos)
        (void)text.substr(at + 18, text.find(' ', at + 18) - at - 18);
      break;
    }
    case schema::ClientEvent::FINISHED: {
      auto f = e.getFinished();
      for (auto file : f.getFiles())
        if (cli::inside_task(file.getPath().cStr()))
          (void)file.getData().size();
      (void)std::string(f.getJson().cStr());
      break;
    }
    case schema::ClientEvent::STATUS: (void)std::string(e.getStatus().cStr()); break;
    case schema::ClientEvent::REFUSED: (void)std::string(e.getRefused().cStr()); break;
    case schema::ClientEvent::REPLY: {
      auto r = e.getReply();
      (void)std::string(r.getText().cStr());
      (void)std::string(r.getJson().cStr());
      (void)std::string(r.getEndpoint().cStr());
      for (auto file : r.getFiles())
        (void)cli::inside_task(file.getPath().cStr());
      break;
    }
  }
  return 0;
}
