#include "errors/table.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "mlakit/dtype.hpp"

namespace mlakit::errors {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A table that describes more than this much memory must use null_data (a case about sizes).
constexpr int64_t kMaxTableBytes = int64_t{1} << 26;

[[noreturn]] void table_error(const std::string& what) {
  throw std::runtime_error("error table: " + what);
}

double to_double(const json& v) {
  if (v.is_number()) return v.get<double>();
  const std::string s = v.get<std::string>();
  if (s == "nan") return std::nan("");
  if (s == "inf") return INFINITY;
  if (s == "-inf") return -INFINITY;
  table_error("not a number: " + s);
}

// Overrides the fields `patch` names; a new shape without strides is dense.
void apply(TensorSpec& t, const json& patch) {
  if (patch.contains("shape")) {
    t.shape = patch["shape"].get<std::vector<int64_t>>();
    t.strides.reset();
  }
  if (patch.contains("strides")) t.strides = patch["strides"].get<std::vector<int64_t>>();
  if (patch.contains("dtype")) t.dtype = patch["dtype"].get<std::string>();
  if (patch.contains("values")) {
    t.values.clear();
    for (const json& v : patch["values"]) t.values.push_back(to_double(v));
  }
  if (patch.contains("device")) t.device = patch["device"].get<std::string>();
  if (patch.contains("null_data")) t.null_data = patch["null_data"].get<bool>();
  if (patch.contains("absent")) t.absent = patch["absent"].get<bool>();
  if (patch.contains("alias_of")) t.alias_of = patch["alias_of"].get<std::string>();
  if (patch.contains("alias_offset")) t.alias_offset = patch["alias_offset"].get<int64_t>();
}

Call apply(Call call, const json& tensors, const json& scalars) {
  for (const auto& [name, patch] : tensors.items()) apply(call.tensors[name], patch);
  for (const auto& [name, value] : scalars.items()) call.scalars[name] = value;
  return call;
}

fs::path cases_dir() { return fs::path(MLAKIT_ERROR_CASES_DIR); }

DLDataType dl_dtype(const std::string& name) {
  if (name.rfind("dl:", 0) == 0) {
    unsigned code = 0, bits = 0, lanes = 0;
    if (std::sscanf(name.c_str() + 3, "%u,%u,%u", &code, &bits, &lanes) != 3) {
      table_error("bad dtype " + name);
    }
    return DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits),
                      static_cast<uint16_t>(lanes)};
  }
  switch (dtype_of(name)) {
    case DType::kF32:
      return {kDLFloat, 32, 1};
    case DType::kF16:
      return {kDLFloat, 16, 1};
    case DType::kBF16:
      return {kDLBfloat, 16, 1};
    case DType::kFp8E4m3:
      return {kDLFloat8_e4m3fn, 8, 1};
    case DType::kU8:
      return {kDLUInt, 8, 1};
    case DType::kI32:
      return {kDLInt, 32, 1};
    case DType::kI64:
      return {kDLInt, 64, 1};
  }
  table_error("bad dtype " + name);
}

}  // namespace

DType dtype_of(const std::string& name) {
  static const std::map<std::string, DType> kNames = {
      {"f32", DType::kF32},          {"f16", DType::kF16}, {"bf16", DType::kBF16},
      {"fp8_e4m3", DType::kFp8E4m3}, {"u8", DType::kU8},   {"i32", DType::kI32},
      {"i64", DType::kI64}};
  const auto it = kNames.find(name);
  if (it == kNames.end()) table_error("dtype " + name + " is not an mlakit dtype");
  return it->second;
}

Table load_table(const std::string& op) {
  std::ifstream file(cases_dir() / (op + ".json"));
  if (!file) table_error("no file for " + op);
  const json j = json::parse(file);
  Table t;
  t.op = j.at("op").get<std::string>();
  t.layers = j.value("layers", std::vector<std::string>{});
  t.base = apply(Call{}, j.at("base").at("tensors"), j.at("base").value("scalars", json::object()));
  for (const json& c : j.at("cases")) {
    Case k;
    k.name = c.at("name").get<std::string>();
    k.call = apply(t.base, c.value("tensors", json::object()), c.value("scalars", json::object()));
    k.expect = c.at("expect").get<std::vector<std::string>>();
    k.status = c.at("status").get<std::string>();
    k.layers = c.value("layers", std::vector<std::string>{});
    k.cpu_only_build = c.value("cpu_only_build", false);
    t.cases.push_back(std::move(k));
  }
  return t;
}

std::vector<std::string> table_ops() {
  std::vector<std::string> ops;
  for (const auto& entry : fs::directory_iterator(cases_dir())) {
    if (entry.path().extension() == ".json") ops.push_back(entry.path().stem().string());
  }
  std::sort(ops.begin(), ops.end());
  return ops;
}

bool runs_in(const Table& t, const std::string& layer) {
  return t.layers.empty() || std::find(t.layers.begin(), t.layers.end(), layer) != t.layers.end();
}

bool runs_in(const Case& c, const std::string& layer) {
  return c.layers.empty() || std::find(c.layers.begin(), c.layers.end(), layer) != c.layers.end();
}

std::string status_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kOutOfRange:
      return "out_of_range";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kBackend:
      return "backend";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

// ---- materialized tensors -----------------------------------------------------------------------

struct Materialized::Tensor {
  TensorSpec spec;
  std::vector<int64_t> strides;       // in effect
  std::unique_ptr<double[]> storage;  // 8-byte aligned memory of the extent
  int64_t bytes = 0;
  void* data = nullptr;
  DLTensor dl{};
};

namespace {

int64_t element_bytes(const std::string& dtype) {
  const DLDataType t = dl_dtype(dtype);
  return std::max<int64_t>(1, (t.bits * t.lanes + 7) / 8);
}

std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    if (__builtin_mul_overflow(stride, std::max<int64_t>(shape[d], 1), &stride)) {
      stride = std::numeric_limits<int64_t>::max();
    }
  }
  return strides;
}

// Elements from the start to the last one the shape and strides reach (plus one); 0 when the
// shape has no element; -1 when that overflows or exceeds kMaxTableBytes.
int64_t extent(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
               int64_t esize) {
  int64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0) return 0;
    int64_t reach = 0;
    if (strides[d] < 0 || __builtin_mul_overflow(shape[d] - 1, strides[d], &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      return -1;
    }
  }
  return last + 1 > kMaxTableBytes / esize ? -1 : last + 1;
}

void store(void* base, const std::string& dtype, int64_t index, double value) {
  if (dtype.rfind("dl:", 0) == 0) return;
  const DType t = dtype_of(dtype);
  switch (t) {
    case DType::kI32:
      static_cast<int32_t*>(base)[index] = static_cast<int32_t>(value);
      return;
    case DType::kI64:
      static_cast<int64_t*>(base)[index] = static_cast<int64_t>(value);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(base)[index] = static_cast<uint8_t>(value);
      return;
    default:
      store_float(base, t, index, static_cast<float>(value));
  }
}

}  // namespace

Materialized::Materialized(const Call& call) : scalars_(call.scalars) {
  for (const auto& [name, spec] : call.tensors) {
    auto t = std::make_unique<Tensor>();
    t->spec = spec;
    t->strides = spec.strides ? *spec.strides : dense_strides(spec.shape);
    if (t->strides.size() != spec.shape.size()) table_error(name + ": strides do not fit shape");
    const int64_t esize = element_bytes(spec.dtype);
    const int64_t elements = extent(spec.shape, t->strides, esize);
    if (elements < 0 && !spec.null_data && !spec.absent && spec.alias_of.empty()) {
      table_error(name + " is too big to back with memory: give it null_data");
    }
    t->bytes = std::max<int64_t>(elements, 0) * esize;
    t->storage.reset(new double[static_cast<size_t>((t->bytes + 7) / 8 + 8)]());
    t->data = spec.null_data ? nullptr : t->storage.get();
    if (t->data && elements > 0 && !spec.values.empty()) {
      int64_t numel = 1;
      for (int64_t s : spec.shape) numel *= s;
      std::vector<int64_t> index(spec.shape.size(), 0);
      for (int64_t i = 0; i < numel; ++i) {
        int64_t offset = 0;
        for (size_t d = 0; d < index.size(); ++d) offset += index[d] * t->strides[d];
        store(t->data, spec.dtype, offset,
              spec.values[static_cast<size_t>(i) % spec.values.size()]);
        for (size_t d = index.size(); d-- > 0;) {
          if (++index[d] < spec.shape[d]) break;
          index[d] = 0;
        }
      }
    }
    tensors_[name] = std::move(t);
  }
  for (auto& [name, t] : tensors_) {  // aliases point into the memory of another tensor
    if (t->spec.alias_of.empty()) continue;
    const auto it = tensors_.find(t->spec.alias_of);
    if (it == tensors_.end()) table_error(name + " aliases an unknown tensor");
    const int64_t esize = element_bytes(t->spec.dtype);
    const int64_t needed =
        (t->spec.alias_offset + std::max<int64_t>(extent(t->spec.shape, t->strides, esize), 0)) *
        esize;
    if (needed > it->second->bytes) table_error(name + " reaches past the tensor it aliases");
    t->data = static_cast<char*>(it->second->data) + t->spec.alias_offset * esize;
  }
  for (auto& [name, t] : tensors_) {
    DLTensor& d = t->dl;
    d.data = t->data;
    d.ndim = static_cast<int32_t>(t->spec.shape.size());
    d.shape = t->spec.shape.data();
    d.strides = t->spec.strides ? t->strides.data() : nullptr;
    d.dtype = dl_dtype(t->spec.dtype);
    int32_t device_type = kDLCPU, device_id = 0;
    if (t->spec.device.rfind("cuda", 0) == 0) {
      device_type = kDLCUDA;
      device_id = t->spec.device.size() > 5 ? std::stoi(t->spec.device.substr(5)) : 0;
    } else if (t->spec.device.rfind("dl:", 0) == 0) {
      device_type = std::stoi(t->spec.device.substr(3));
    }
    // Any int, as a C caller may store it (not read back as the enum here).
    std::memcpy(&d.device.device_type, &device_type, sizeof(device_type));
    d.device.device_id = device_id;
  }
}

Materialized::~Materialized() = default;

bool Materialized::present(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it != tensors_.end() && !it->second->spec.absent;
}

TensorView Materialized::view(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) table_error("no tensor " + name);
  const Tensor& t = *it->second;
  if (static_cast<int>(t.spec.shape.size()) > kMaxDims) {
    table_error(name + " has more dimensions than a TensorView: a case for the C ABI only");
  }
  TensorView v;
  v.data = t.data;
  v.dtype = dtype_of(t.spec.dtype);
  v.device =
      t.spec.device.rfind("cuda", 0) == 0 ? Device::cuda(t.dl.device.device_id) : Device::cpu();
  v.ndim = static_cast<int>(t.spec.shape.size());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.spec.shape[d];
    v.strides[d] = t.strides[d];
  }
  return v;
}

std::optional<TensorView> Materialized::optional_view(const std::string& name) const {
  if (!present(name)) return std::nullopt;
  return view(name);
}

const DLTensor* Materialized::dl(const std::string& name) const {
  if (!present(name)) return nullptr;
  return &tensors_.at(name)->dl;
}

int64_t Materialized::numel(const std::string& name) const {
  int64_t n = 1;
  for (int64_t s : tensors_.at(name)->spec.shape) n *= s;
  return n;
}

double Materialized::number(const std::string& scalar) const {
  if (!scalars_.contains(scalar)) table_error("no scalar " + scalar);
  return to_double(scalars_[scalar]);
}

int64_t Materialized::integer(const std::string& scalar) const {
  if (!scalars_.contains(scalar)) table_error("no scalar " + scalar);
  return scalars_[scalar].get<int64_t>();
}

std::string Materialized::text(const std::string& scalar) const {
  if (!scalars_.contains(scalar)) table_error("no scalar " + scalar);
  return scalars_[scalar].get<std::string>();
}

bool Materialized::has_scalar(const std::string& scalar) const { return scalars_.contains(scalar); }

}  // namespace mlakit::errors
