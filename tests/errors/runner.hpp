// The loop every layer's runner shares: the base call must succeed, every case must fail with its
// status and a message that contains each expected substring.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "errors/table.hpp"

namespace mlakit::errors {

// What one call through a layer gave.
struct Outcome {
  bool ok = true;
  std::string status;   // status_name() of the error
  std::string message;  // the message the caller sees
};

inline void check_table(const std::string& op, const std::string& layer,
                        const std::function<Outcome(const Materialized&)>& run) {
  const Table table = load_table(op);
  if (!runs_in(table, layer)) GTEST_SKIP() << op << " has no " << layer << " entry point";
  {
    SCOPED_TRACE("base call");
    const Materialized m(table.base);
    const Outcome o = run(m);
    EXPECT_TRUE(o.ok) << "the valid base call failed: " << o.message;
  }
#ifdef MLAKIT_WITH_CUDA
  const bool cuda_build = true;
#else
  const bool cuda_build = false;
#endif
  int ran = 0;
  for (const Case& c : table.cases) {
    if (!runs_in(c, layer) || (c.cpu_only_build && cuda_build)) continue;
    SCOPED_TRACE(c.name);
    ++ran;
    const Materialized m(c.call);
    const Outcome o = run(m);
    if (o.ok) {
      ADD_FAILURE() << "the call succeeded";
      continue;
    }
    EXPECT_EQ(o.status, c.status) << o.message;
    for (const std::string& part : c.expect) {
      EXPECT_NE(o.message.find(part), std::string::npos)
          << "message: " << o.message << "\n  lacks: " << part;
    }
  }
  EXPECT_GT(ran, 0) << "no case of " << op << " runs in " << layer;
}

// The op's name as the test's name: ErrorTableCpp.EveryMalformedCall.../mla_decode.
inline std::string op_test_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

}  // namespace mlakit::errors
