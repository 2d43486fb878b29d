// The bad-input table (tests/errors/cases/<op>.json), read by one runner per API layer: C++
// (errors_cpp_test), the C ABI (errors_capi_test) and Python (python/tests/test_error_table.py).
//
// A table holds one valid call of an op (`base`: its tensors and scalars) and the malformed calls
// derived from it (`cases`: what `set` changes, the substrings the message must contain, the
// status). Every runner first checks that the base call succeeds, so that each case fails for its
// own defect. README.md of this folder describes the format.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "mlakit/dlpack.h"
#include "mlakit/error.hpp"
#include "mlakit/types.hpp"

namespace mlakit::errors {

// One tensor argument of a call.
struct TensorSpec {
  std::vector<int64_t> shape;
  std::optional<std::vector<int64_t>> strides;  // elements; absent: dense row-major
  std::string dtype = "f32";   // f32 f16 bf16 fp8_e4m3 u8 i32 i64, or "dl:<code>,<bits>,<lanes>"
  std::vector<double> values;  // logical row-major contents, cycled; empty: zeros
  std::string device = "cpu";  // "cpu", "cuda:<n>", or "dl:<DLDeviceType value>" (C ABI only)
  bool null_data = false;      // a data pointer of NULL although the shape has elements
  bool absent = false;         // the argument is not given (NULL / std::nullopt / None)
  std::string alias_of;        // the memory of another tensor of the call ...
  int64_t alias_offset = 0;    // ... starting this many of its own elements in
};

struct Call {
  std::map<std::string, TensorSpec> tensors;
  nlohmann::json scalars = nlohmann::json::object();
};

struct Case {
  std::string name;
  Call call;
  std::vector<std::string> expect;  // substrings of the message, in any order
  std::string status;               // invalid_argument, out_of_range or unsupported
  std::vector<std::string> layers;  // cpp, c, python (empty: all)
  bool cpu_only_build = false;      // meaningful only where mlakit has no CUDA backend
};

struct Table {
  std::string op;
  Call base;
  std::vector<Case> cases;
  std::vector<std::string> layers;  // the layers that have this op (empty: all)
};

// cases/<op>.json of the source tree.
Table load_table(const std::string& op);
// The ops with a table, in file order of the folder.
std::vector<std::string> table_ops();
bool runs_in(const Table& t, const std::string& layer);
bool runs_in(const Case& c, const std::string& layer);

// "invalid_argument", "out_of_range", "unsupported", "backend", "internal".
std::string status_name(ErrorCode code);

// Host memory behind the tensors of one call, as mlakit views and as DLPack tensors.
class Materialized {
 public:
  explicit Materialized(const Call& call);
  ~Materialized();
  Materialized(const Materialized&) = delete;
  Materialized& operator=(const Materialized&) = delete;

  bool present(const std::string& name) const;  // given and not absent
  TensorView view(const std::string& name) const;
  std::optional<TensorView> optional_view(const std::string& name) const;
  const DLTensor* dl(const std::string& name) const;  // nullptr when absent
  int64_t numel(const std::string& name) const;

  double number(const std::string& scalar) const;  // "nan", "inf", "-inf" allowed
  int64_t integer(const std::string& scalar) const;
  std::string text(const std::string& scalar) const;
  bool has_scalar(const std::string& scalar) const;
  const nlohmann::json& scalars() const { return scalars_; }

 private:
  struct Tensor;
  std::map<std::string, std::unique_ptr<Tensor>> tensors_;
  nlohmann::json scalars_;
};

// An mlakit DType from a table dtype name (throws for "dl:" dtypes, which mlakit has not).
DType dtype_of(const std::string& name);

}  // namespace mlakit::errors
