#include "cli/hint_operator.hpp"

#include "maxkernel/schema/operator.capnp.h"
#include "messages/error.hpp"
#include "messages/payload_codec.hpp"

#include <caf/actor_system.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <capnp/message.h>

#include <string>

namespace maxkernel::cli {

namespace {

messages::operator_actor::behavior_type hint_operator(messages::operator_actor::pointer) {
  return {
    [](messages::propose_atom, const messages::payload& p) -> caf::result<messages::payload> {
      std::string error;
      auto msg = messages::open_payload<schema::Proposal>(p, error);
      if (!msg)
        return messages::make_error(messages::error_code::malformed_message, "Proposal: " + error);
      auto proposal = msg->root<schema::Proposal>();
      auto v = proposal.getVertex();
      capnp::MallocMessageBuilder out;
      auto d = out.initRoot<schema::Decision>();
      d.setSchemaVersion(schema::SCHEMA_VERSION);
      d.setSeq(proposal.getSeq());
      d.setOperator("hint-script");
      auto suggestions = v.getDiagnosis().getSuggestions();
      if (v.getCorrect() && v.getHasDiagnosis() && suggestions.size() > 0 &&
          suggestions[0].getRationale().size() > 0) {
        d.setKind(schema::DecisionKind::HINT);
        d.setText(suggestions[0].getRationale());
      } else {
        d.setKind(schema::DecisionKind::APPROVE);
      }
      return messages::make_payload<schema::Decision>(out);
    },
    [](messages::notify_atom, const messages::payload&) {},
    [](messages::status_atom) -> uint32_t { return 1; },
  };
}

}  // namespace

messages::operator_actor spawn_hint_operator(caf::actor_system& sys) {
  return sys.spawn(hint_operator);
}

}  // namespace maxkernel::cli
