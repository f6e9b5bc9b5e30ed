# A cluster's client port (docs/cluster.md): `maxkernel optimize --cluster` sends its task and
# options to the supervisor process, which runs the search on the cluster and streams what
# the run prints; at the end it sends back the files the run wrote. One message per ZeroMQ
# frame, DEALER (client) to ROUTER (supervisor).
@0xd8ee778375ec7202;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("maxkernel::schema");

using import "kernel_spec.capnp".TaskFile;

struct Submission {
  command @0 :Text;            # optimize
  args @1 :List(Text);         # the command's options as typed, without the spec and the
                               # options that name local files (--out, --json) or the cluster
  specName @2 :Text;           # the spec's file or directory name
  specIsDirectory @3 :Bool;
  files @4 :List(TaskFile);    # the spec file, or every file of the task's directory
  wantOutputs @5 :Bool;        # send back the output directory's files (--out was given)
  outShown @6 :Text;           # the client's --out, as the run's words name it
}

struct ClientRequest {
  schemaVersion @0 :UInt32;
  union {
    submit @1 :Submission;
    status @2 :Void;           # -> ClientEvent.status
    command @3 :List(Text);    # an operator shell's command, its words -> ClientEvent.reply
  }
}

struct ShellReply {
  ok @0 :Bool;                 # false: the command failed; `text` says why
  text @1 :Text;               # for a person
  json @2 :Text;               # the same for a script ("" when there is no more to say)
  files @3 :List(TaskFile);    # export: the task's outputs
  endpoint @4 :Text;           # attach: the task's operator gateway
}

struct RunOutput {
  stream @0 :UInt8;            # 1 stdout, 2 stderr
  text @1 :Text;
}

struct RunFinished {
  exitCode @0 :Int32;
  files @1 :List(TaskFile);    # the output directory (when wanted)
  json @2 :Text;               # result.json's text ("" when the run failed before it)
}

struct ClientEvent {
  schemaVersion @0 :UInt32;
  union {
    output @1 :RunOutput;
    finished @2 :RunFinished;
    status @3 :Text;           # the cluster: nodes, queue, runs
    refused @4 :Text;          # the request is malformed or cannot be run (exit code 2)
    reply @5 :ShellReply;
  }
}
