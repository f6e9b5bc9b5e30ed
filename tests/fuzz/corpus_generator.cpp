// Writes the seed corpora of the fuzz targets: small valid messages of every inbound type
// (sample_message), in the form each target reads, plus hand-made hostile cases.
// Usage: fuzz_corpus_generator DIR (makes DIR/<target>/).
#include "inbound_types.hpp"
#include "maxkernel/schema/submission.capnp.h"
#include "maxkernel/schema/worker.capnp.h"
#include "messages/atoms.hpp"
#include "messages/capnp_io.hpp"
#include "messages/payload.hpp"
#include "messages/type_registry.hpp"
#include "sample_message.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/make_message.hpp>
#include <capnp/message.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace fs = std::filesystem;
using namespace maxkernel;

namespace {

void write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

template <class T>
std::string caf_bytes(caf::actor_system& sys, const T& x) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  if (auto err = sink(const_cast<T&>(x)))
    throw std::runtime_error("cannot serialize");
  return std::string(buf.begin(), buf.end());
}

std::string submission(const std::string& spec_name, const std::string& file_path) {
  capnp::MallocMessageBuilder msg;
  auto req = msg.initRoot<schema::ClientRequest>();
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  auto sub = req.initSubmit();
  sub.setCommand("optimize");
  auto args = sub.initArgs(2);
  args.set(0, "--budget");
  args.set(1, "3");
  sub.setSpecName(spec_name);
  auto files = sub.initFiles(1);
  files[0].setPath(file_path);
  files[0].setData(kj::StringPtr("name: add\n").asBytes());
  return messages::encode(msg);
}

std::string finished(const std::string& file_path) {
  capnp::MallocMessageBuilder msg;
  auto e = msg.initRoot<schema::ClientEvent>();
  e.setSchemaVersion(schema::SCHEMA_VERSION);
  auto f = e.initFinished();
  f.setExitCode(0);
  auto files = f.initFiles(1);
  files[0].setPath(file_path);
  files[0].setData(kj::StringPtr("{}").asBytes());
  f.setJson("{}");
  return messages::encode(msg);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_corpus_generator DIR\n";
    return 2;
  }
  fs::path root = argv[1];

  caf::actor_system_config cfg;
  messages::register_types(cfg);
  cfg.set("scheduler.max-threads", 1);
  caf::actor_system sys{cfg};

  const auto& types = fuzz::inbound_types();
  for (size_t i = 0; i < types.size(); ++i) {
    auto members = types[i].schema.getUnionFields().size();
    for (unsigned v = 0; v < std::max<unsigned>(1, members); ++v) {
      auto bytes = fuzz::sample_message(types[i].schema, v);
      auto name = std::string(types[i].name) + "-" + std::to_string(v);
      // capnp_roots: the type's index, then the message.
      write(root / "capnp_roots", name, std::string(1, static_cast<char>(i)) + bytes);
      // caf_payload: a bare payload, and the message a node gets (evaluate, payload, deadline).
      messages::payload p{types[i].id, bytes};
      if (v == 0)
        write(root / "caf_payload", name, std::string(1, '\0') + caf_bytes(sys, p));
      auto m = caf::make_message(messages::evaluate_atom::value, p, uint32_t{1000});
      if (v == 0)
        write(root / "caf_payload", name + "-message", std::string(1, '\1') + caf_bytes(sys, m));
      if (types[i].id == capnp::typeId<schema::ClientRequest>())
        write(root / "client_request", name, bytes);
      if (types[i].id == capnp::typeId<schema::ClientEvent>())
        write(root / "client_event", name, bytes);
      if (types[i].id == capnp::typeId<schema::WorkerReply>())
        write(root / "worker_reply", name, bytes);
    }
  }
  // What the servers must refuse, and what they run.
  write(root / "client_request", "submit-ok", submission("spec.yaml", "spec.yaml"));
  write(root / "client_request", "submit-dotdot", submission("spec.yaml", "../../etc/passwd"));
  write(root / "client_request", "submit-absolute", submission("task", "/etc/passwd"));
  write(root / "client_request", "submit-slash-name", submission("a/b", "x"));
  write(root / "client_event", "finished-ok", finished("result.json"));
  write(root / "client_event", "finished-dotdot", finished("../.bashrc"));
  write(root / "client_event", "finished-absolute", finished("/tmp/x"));
  return 0;
}
