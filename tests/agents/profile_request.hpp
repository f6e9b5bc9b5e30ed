// Builds ProfilerRequests by hand for the profiler's tests: a Profile with per-call figures
// and, optionally, the KernelStructure (through tests/tpu_nodes/model's structure_builder).
#pragma once

#include "maxkernel/schema/agent.capnp.h"
#include "maxkernel/schema/common.capnp.h"
#include "tests/tpu_nodes/model/structure_builder.hpp"

#include <capnp/message.h>

#include <string>
#include <vector>

namespace maxkernel::tests {

struct traffic_spec {
  std::string role = "input";
  unsigned index = 0;
  double copies = 1;
  double bytes = 0;
};

struct call_profile_spec {
  std::string name = "kernel";
  std::string bound = "compute";
  double time_us = 0, compute_us = 0, dma_us = 0, exposed_dma_us = 0, overhead_us = 0;
  double hbm_bytes = 0;
  double steps = 1;
  unsigned cores_used = 1;
  int64_t vmem_bytes = 0;
  std::vector<traffic_spec> traffic;
};

struct profile_spec {
  std::string bound = "compute";
  double time_us = 0, roofline_us = 0, outside_us = 0;
  std::vector<call_profile_spec> calls;
};

inline void build_request(schema::ProfilerRequest::Builder req, const profile_spec& p,
                          const std::vector<call_spec>& structure, const std::string& chip) {
  req.setSchemaVersion(schema::SCHEMA_VERSION);
  req.setChip(chip);
  auto prof = req.initProfile();
  prof.setSchemaVersion(schema::SCHEMA_VERSION);
  prof.setTiming(schema::Timing::MODELED);
  prof.setChip(chip);
  prof.setBound(p.bound);
  prof.setTimeUs(p.time_us);
  prof.setRooflineUs(p.roofline_us);
  prof.setOutsideUs(p.outside_us);
  auto calls = prof.initCalls(static_cast<unsigned>(p.calls.size()));
  for (unsigned i = 0; i < p.calls.size(); ++i) {
    const auto& c = p.calls[i];
    auto b = calls[i];
    b.setName(c.name);
    b.setBound(c.bound);
    b.setTimeUs(c.time_us);
    b.setComputeUs(c.compute_us);
    b.setDmaUs(c.dma_us);
    b.setMemoryUs(c.dma_us);
    b.setExposedDmaUs(c.exposed_dma_us);
    b.setOverheadUs(c.overhead_us);
    b.setHbmBytes(c.hbm_bytes);
    b.setSteps(c.steps);
    b.setCoresUsed(c.cores_used);
    b.setVmemBytes(c.vmem_bytes);
    b.setCount(1);
    auto t = b.initTraffic(static_cast<unsigned>(c.traffic.size()));
    for (unsigned j = 0; j < c.traffic.size(); ++j) {
      t[j].setRole(c.traffic[j].role);
      t[j].setIndex(c.traffic[j].index);
      t[j].setCopies(c.traffic[j].copies);
      t[j].setBytes(c.traffic[j].bytes);
    }
  }
  req.setHasStructure(!structure.empty());
  auto ks = req.initStructure();
  ks.setSchemaVersion(schema::SCHEMA_VERSION);
  auto pcs = ks.initPallasCalls(static_cast<unsigned>(structure.size()));
  for (unsigned i = 0; i < structure.size(); ++i)
    build_call(pcs[i], structure[i]);
}

}  // namespace maxkernel::tests
