// A frame on a cluster's client port, read as the supervisor reads it (cli/client_request):
// the request checked, a submission's name, files and size checked, a command's words read.
#include "cli/client_request.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace maxkernel;
  std::string why;
  auto msg = cli::read_client_request(std::string(reinterpret_cast<const char*>(data), size), why);
  if (!msg)
    return 0;
  // read_client_request checked every pointer: the server's reads below do not catch.
  auto req = msg->root<schema::ClientRequest>();
  switch (req.which()) {
    case schema::ClientRequest::SUBMIT: {
      auto sub = req.getSubmit();
      if (!cli::check_submission(sub, why))
        return 0;
      std::vector<std::string> args;
      for (auto a : sub.getArgs())
        args.emplace_back(a.cStr());
      std::string out_shown = sub.getOutShown().cStr();
      for (auto f : sub.getFiles())
        (void)f.getData().size();
      break;
    }
    case schema::ClientRequest::STATUS: break;
    case schema::ClientRequest::COMMAND: {
      std::vector<std::string> words;
      for (auto w : req.getCommand())
        words.emplace_back(w.cStr());
      break;
    }
  }
  return 0;
}
