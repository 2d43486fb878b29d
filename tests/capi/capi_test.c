/* The C ABI from plain C: version queries, error reporting (status and message text), a planner
 * call, two small ops against results computed by hand, the entry points taking scales as tensors
 * (and the dynamic fp8 quant) against references computed here, an engine step (one plan, two
 * layers) against the single-call forward, and a DCP layer over a callback communicator. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mlakit/mlakit.h"

static int g_passed = 0;
static int g_failed = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (cond) {                                                                \
      ++g_passed;                                                              \
    } else {                                                                   \
      ++g_failed;                                                              \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                          \
  } while (0)

/* Checks status == expected and, when expected != OK, that the message contains `needle`. */
static void check_status(mlakit_status_t status, mlakit_status_t expected, const char* needle,
                         int line) {
  const char* message = mlakit_last_error();
  if (status != expected) {
    ++g_failed;
    fprintf(stderr, "line %d: status %s, expected %s (last error: %s)\n", line,
            mlakit_status_name(status), mlakit_status_name(expected), message);
    return;
  }
  if (needle != NULL && strstr(message, needle) == NULL) {
    ++g_failed;
    fprintf(stderr, "line %d: message '%s' lacks '%s'\n", line, message, needle);
    return;
  }
  ++g_passed;
}
#define CHECK_STATUS(call, expected, needle) check_status((call), (expected), (needle), __LINE__)

static DLTensor host_tensor(void* data, DLDataType dtype, int32_t ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = NULL; /* dense */
  t.byte_offset = 0;
  return t;
}

static const DLDataType kF32 = {kDLFloat, 32, 1};
static const DLDataType kF64 = {kDLFloat, 64, 1};
static const DLDataType kFp8 = {kDLFloat8_e4m3fn, 8, 1};

static void test_version(void) {
  CHECK(strcmp(mlakit_version(), "") != 0);
  CHECK(mlakit_abi_version() == MLAKIT_C_ABI_VERSION);
  const char* info = mlakit_build_info();
  CHECK(info[0] == '{');
  CHECK(strstr(info, "\"cuda\": ") != NULL);
  CHECK(strstr(info, "\"blas\": \"openblas-openmp\"") != NULL);
  CHECK(strstr(info, "\"threads\": ") != NULL);
  CHECK(strstr(info, mlakit_version()) != NULL);
  CHECK(strcmp(mlakit_status_name(MLAKIT_ERROR_OUT_OF_RANGE), "out_of_range") == 0);
}

static void test_errors(void) {
  /* NULL required tensor: named in the message. */
  CHECK_STATUS(
      mlakit_concat_and_cache_mla(NULL, NULL, NULL, NULL, MLAKIT_KV_CACHE_AUTO, 1.0f, NULL),
      MLAKIT_ERROR_INVALID_ARGUMENT, "concat_and_cache_mla: kv_c must not be NULL");

  /* float64 is not an mlakit dtype. */
  double values[2] = {0.0, 0.0};
  int64_t shape[1] = {2};
  DLTensor f64 = host_tensor(values, kF64, 1, shape);
  CHECK_STATUS(mlakit_scaled_fp8_quant(&f64, &f64, 1.0f, NULL), MLAKIT_ERROR_INVALID_ARGUMENT,
               "scaled_fp8_quant: input has unsupported DLPack dtype (code 2, bits 64, lanes 1)");

  /* A device mlakit has no backend for. */
  float f[2] = {0.0f, 0.0f};
  DLTensor opencl = host_tensor(f, kF32, 1, shape);
  opencl.device.device_type = kDLOpenCL;
  CHECK_STATUS(mlakit_scaled_fp8_quant(&opencl, &opencl, 1.0f, NULL), MLAKIT_ERROR_UNSUPPORTED,
               "DLPack device type 4");

  /* A NULL data pointer with a byte_offset: refused, never read at the address NULL + offset
   * (it was, and crashed). An offset that wraps the address space is refused too. */
  uint8_t codes[2] = {0, 0};
  DLTensor t_codes = host_tensor(codes, kFp8, 1, shape);
  DLTensor null_data = host_tensor(NULL, kF32, 1, shape);
  null_data.byte_offset = 4096;
  CHECK_STATUS(mlakit_scaled_fp8_quant(&null_data, &t_codes, 1.0f, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT, "scaled_fp8_quant: input has no data pointer");
  DLTensor wrapped = host_tensor(f, kF32, 1, shape);
  wrapped.byte_offset = UINT64_MAX - 3;
  CHECK_STATUS(mlakit_scaled_fp8_quant(&wrapped, &t_codes, 1.0f, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT, "input data + byte_offset");

  /* Bad enumerations and strings. */
  int32_t parsed = -1;
  CHECK_STATUS(mlakit_parse_kv_cache_dtype("fp8_e5m2", &parsed), MLAKIT_ERROR_INVALID_ARGUMENT,
               "got 'fp8_e5m2'");
  CHECK_STATUS(mlakit_parse_kv_cache_dtype("fp8", &parsed), MLAKIT_OK, NULL);
  CHECK(parsed == MLAKIT_KV_CACHE_FP8_E4M3);

  /* An error raised inside the library: a decreasing query_start_loc. The message of the earlier
   * failure must be replaced. */
  const int32_t qsl[3] = {0, 2, 1};
  mlakit_split_counts_t counts;
  CHECK_STATUS(mlakit_split_decodes_and_prefills(qsl, 2, 2, 1, 0, &counts),
               MLAKIT_ERROR_INVALID_ARGUMENT, "query_start_loc");
  CHECK(strstr(mlakit_last_error(), "fp8_e5m2") == NULL);

  /* A plan getter with an out-of-range chunk index. */
  mlakit_planner_config_t config;
  mlakit_planner_config_init(&config);
  config.block_size = 4;
  config.workspace_tokens = 64;
  const int32_t qsl2[2] = {0, 3};
  const int32_t seq_lens[1] = {3};
  mlakit_plan_t* plan = NULL;
  CHECK_STATUS(mlakit_make_plan(qsl2, seq_lens, 1, 3, 1, &config, &plan), MLAKIT_OK, NULL);
  int64_t total = 0;
  int64_t max_len = 0;
  CHECK_STATUS(mlakit_plan_get_chunk_info(plan, 0, &total, &max_len), MLAKIT_ERROR_OUT_OF_RANGE,
               "plan_get_chunk_info: chunk must be in [0, 0), got 0");
  mlakit_plan_destroy(plan);
}

/* A decode and a prefill with context: the split and the plan's arrays, counted by hand. */
static void test_planner(void) {
  /* Request 0 decodes 1 token after 9 computed; request 1 prefills 4 tokens after 6 computed. */
  const int32_t qsl[3] = {0, 1, 5};
  const int32_t seq_lens[2] = {10, 10};
  mlakit_split_counts_t counts;
  CHECK_STATUS(mlakit_split_decodes_and_prefills(qsl, 2, 5, 1, 0, &counts), MLAKIT_OK, NULL);
  CHECK(counts.num_decodes == 1 && counts.num_prefills == 1);
  CHECK(counts.num_decode_tokens == 1 && counts.num_prefill_tokens == 4);

  mlakit_planner_config_t config;
  mlakit_planner_config_init(&config);
  config.block_size = 4;
  config.workspace_tokens = 64;
  mlakit_plan_t* plan = NULL;
  CHECK_STATUS(mlakit_make_plan(qsl, seq_lens, 2, 5, 3, &config, &plan), MLAKIT_OK, NULL);
  mlakit_plan_summary_t summary;
  CHECK_STATUS(mlakit_plan_get_summary(plan, &summary), MLAKIT_OK, NULL);
  CHECK(summary.num_context_chunks == 1);
  const int32_t* context_lens = NULL;
  int64_t length = 0;
  CHECK_STATUS(
      mlakit_plan_get_array(plan, MLAKIT_PLAN_PREFILL_CONTEXT_LENS, &context_lens, &length),
      MLAKIT_OK, NULL);
  CHECK(length == 1 && context_lens[0] == 6);
  const int32_t* cu = NULL;
  CHECK_STATUS(mlakit_plan_get_chunk_array(plan, 0, MLAKIT_CHUNK_CU_SEQ_LENS, &cu, &length),
               MLAKIT_OK, NULL);
  CHECK(length == 2 && cu[0] == 0 && cu[1] == 6);
  mlakit_plan_destroy(plan);

  /* Request counts past int32 are refused before any entry is read: num_reqs + 1 overflowed
   * int64 (INT64_MAX), and the lengths past the caller's arrays were read (a batch of 2^40 for
   * plan_mla_decode crashed). */
  CHECK_STATUS(mlakit_split_decodes_and_prefills(qsl, INT64_MAX, 5, 1, 0, &counts),
               MLAKIT_ERROR_INVALID_ARGUMENT,
               "split_decodes_and_prefills: num_reqs must be at most 2147483647");
  CHECK_STATUS(mlakit_make_plan(qsl, seq_lens, INT64_MAX, 5, 3, &config, &plan),
               MLAKIT_ERROR_INVALID_ARGUMENT, "make_plan: num_reqs must be at most 2147483647");
  mlakit_decode_plan_shape_t shape;
  memset(&shape, 0, sizeof(shape));
  shape.device.device_type = kDLCPU;
  shape.batch = (int64_t)1 << 40;
  shape.s_q = 1;
  shape.num_heads = 1;
  shape.block_size = 16;
  shape.max_seq_len = INT32_MAX;
  mlakit_decode_schedule_t* schedule = NULL;
  CHECK_STATUS(mlakit_plan_mla_decode(&shape, seq_lens, &schedule), MLAKIT_ERROR_INVALID_ARGUMENT,
               "plan_mla_decode: shape.batch must be at most 2147483647");
}

/* merge_attn_states, T = 1, H = 2, D = 2. Head 0: prefix [1, 2] with lse 0, suffix [3, 5] with
 * lse ln 3, so the weights are 1/4 and 3/4: out = [2.5, 4.25], lse = ln 4. Head 1: both sides
 * empty (-inf): out = 0, lse = -inf. */
static void test_merge(void) {
  float prefix[4] = {1.0f, 2.0f, 7.0f, 7.0f};    /* [T, H, D] */
  float suffix[4] = {3.0f, 5.0f, 9.0f, 9.0f};    /* [T, H, D] */
  float prefix_lse[2] = {0.0f, -INFINITY};       /* [H, T] */
  float suffix_lse[2] = {logf(3.0f), -INFINITY}; /* [H, T] */
  float out[4] = {NAN, NAN, NAN, NAN};
  float out_lse[2] = {NAN, NAN};
  int64_t out_shape[3] = {1, 2, 2};
  int64_t lse_shape[2] = {2, 1};
  DLTensor t_prefix = host_tensor(prefix, kF32, 3, out_shape);
  DLTensor t_suffix = host_tensor(suffix, kF32, 3, out_shape);
  DLTensor t_out = host_tensor(out, kF32, 3, out_shape);
  DLTensor t_prefix_lse = host_tensor(prefix_lse, kF32, 2, lse_shape);
  DLTensor t_suffix_lse = host_tensor(suffix_lse, kF32, 2, lse_shape);
  DLTensor t_out_lse = host_tensor(out_lse, kF32, 2, lse_shape);
  CHECK_STATUS(mlakit_merge_attn_states(&t_out, &t_prefix, &t_prefix_lse, &t_suffix, &t_suffix_lse,
                                        &t_out_lse, NULL),
               MLAKIT_OK, NULL);
  const float tol = 1e-6f; /* f32 rounding of a few operations on values near 1..5 */
  CHECK(fabsf(out[0] - 2.5f) < tol);
  CHECK(fabsf(out[1] - 4.25f) < tol);
  CHECK(out[2] == 0.0f && out[3] == 0.0f);
  CHECK(fabsf(out_lse[0] - logf(4.0f)) < tol);
  CHECK(isinf(out_lse[1]) && out_lse[1] < 0);
}

/* scaled_fp8_quant with scale 2 of [1, -3, 1000, 0.3] with the second element read through
 * strides and byte_offset: x / 2 = [0.5, -1.5, 500 -> 448 (saturated), 0.15 -> 0.15625]. */
static void test_fp8_quant(void) {
  float x[5] = {99.0f, 1.0f, -3.0f, 1000.0f, 0.3f};
  uint8_t out[4] = {0, 0, 0, 0};
  int64_t shape[1] = {4};
  int64_t stride[1] = {1};
  DLTensor t_x = host_tensor(x, kF32, 1, shape);
  t_x.byte_offset = sizeof(float); /* skip x[0] */
  t_x.strides = stride;
  DLTensor t_out = host_tensor(out, kFp8, 1, shape);
  CHECK_STATUS(mlakit_scaled_fp8_quant(&t_x, &t_out, 2.0f, NULL), MLAKIT_OK, NULL);
  CHECK(out[0] == 0x30); /* 0.5   = 2^-1:         sign 0, exponent 6 (bias 7), mantissa 000 */
  CHECK(out[1] == 0xBC); /* -1.5  = -1.1b * 2^0:  sign 1, exponent 7, mantissa 100 */
  CHECK(out[2] == 0x7E); /* 448   = 1.11b * 2^8:  the largest finite e4m3fn value */
  CHECK(out[3] == 0x22); /* 0.15 -> 1.01b * 2^-3: exponent 4, mantissa 010 (nearest) */
}

/* Fills x[0..n) with values in [-1, 1) from a fixed linear congruential sequence. */
static void fill_random(float* x, int n, uint32_t* state) {
  for (int i = 0; i < n; ++i) {
    *state = *state * 1664525u + 1013904223u; /* Numerical Recipes' LCG constants */
    x[i] = (float)(*state >> 8) / (float)(1u << 23) - 1.0f;
  }
}

/* ---- Scales as tensors ---------------------------------------------------------------------- */

/* The value of an e4m3fn code: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
 * subnormal (mantissa * 2^-9); 0x7f and 0xff are NaN. */
static double e4m3_value(uint8_t code) {
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 7;
  double magnitude;
  if (exponent == 0xf && mantissa == 7) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = ldexp(mantissa, -9);
  } else {
    magnitude = ldexp(1.0 + mantissa / 8.0, exponent - 7);
  }
  return (code & 0x80) ? -magnitude : magnitude;
}

/* The e4m3fn code nearest to v, ties to the even code, saturating at +-448 (the largest finite
 * value): a search over the finite non-negative codes 0x00..0x7e, whose values increase. */
static uint8_t e4m3_nearest(double v) {
  const double target = fmin(fabs(v), 448.0);
  uint8_t best = 0;
  for (int code = 1; code <= 0x7e; ++code) {
    const double distance = fabs(e4m3_value((uint8_t)code) - target);
    const double best_distance = fabs(e4m3_value(best) - target);
    if (distance < best_distance || (distance == best_distance && code % 2 == 0)) {
      best = (uint8_t)code;
    }
  }
  return (uint8_t)(signbit(v) ? 0x80 | best : best);
}

/* Fills codes[0..n) with e4m3 codes from the LCG of fill_random, NaN codes (0x7f, 0xff) moved
 * to their neighbours 0x7e, 0xfe. */
static void fill_random_codes(uint8_t* codes, int n, uint32_t* state) {
  for (int i = 0; i < n; ++i) {
    *state = *state * 1664525u + 1013904223u; /* Numerical Recipes' LCG constants */
    codes[i] = (uint8_t)(*state >> 24);
    if ((codes[i] & 0x7f) == 0x7f) codes[i] ^= 1;
  }
}

/* A scale tensor that every tensor-scale entry point rejects before reading an element: the
 * status and the message after "<op>: " (mlakit.h names the argument "scale"). */
typedef struct bad_scale {
  const char* message;
  mlakit_status_t status;
  int is_null; /* passed as NULL instead of &tensor */
  DLTensor tensor;
} bad_scale_t;

enum { kBadScales = 10 };

static void make_bad_scales(bad_scale_t bad[kBadScales]) {
  static float storage[2] = {1.0f, 1.0f}; /* 2: room for the two-element scale */
  static int64_t one[1] = {1}, two[1] = {2}, none[1] = {0}, ones5[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < kBadScales; ++i) {
    bad[i].status = MLAKIT_ERROR_INVALID_ARGUMENT;
    bad[i].is_null = 0;
    bad[i].tensor = host_tensor(storage, kF32, 1, one);
  }
  bad[0].message = "scale must have dtype f32, got f16";
  bad[0].tensor.dtype = (DLDataType){kDLFloat, 16, 1};
  bad[1].message = "scale has unsupported DLPack dtype (code 2, bits 64, lanes 1)";
  bad[1].tensor.dtype = kF64;
  bad[2].message = "scale must have exactly one element, got shape [2]";
  bad[2].tensor.shape = two;
  bad[3].message = "scale must have exactly one element, got shape [0]";
  bad[3].tensor.shape = none;
  bad[4].message = "scale must have at most 4 dimensions, got 5";
  bad[4].tensor.ndim = 5;
  bad[4].tensor.shape = ones5;
  bad[5].message = "scale must be on cpu, got cuda:0"; /* host memory described as CUDA's */
  bad[5].tensor.device.device_type = kDLCUDA;
  bad[6].message = "scale lives on DLPack device type 4";
  bad[6].status = MLAKIT_ERROR_UNSUPPORTED;
  bad[6].tensor.device.device_type = kDLOpenCL;
  bad[7].message = "scale must not be NULL";
  bad[7].is_null = 1;
  bad[8].message = "scale has no data pointer but 1 elements";
  bad[8].tensor.data = NULL;
  bad[9].message = "scale (data + byte_offset) must be aligned to 4 bytes";
  bad[9].tensor.byte_offset = 2; /* 2: half an f32 */
}

static const DLTensor* bad_scale_arg(const bad_scale_t* bad) {
  return bad->is_null ? NULL : &bad->tensor;
}

/* "<op>: <message>" of a bad scale, for CHECK_STATUS. */
static const char* bad_scale_needle(const char* op, const bad_scale_t* bad) {
  static char needle[256];
  snprintf(needle, sizeof(needle), "%s: %s", op, bad->message);
  return needle;
}

/* Cache geometry of the tensor-scale cache tests: blocks of 4 entries of L + R = 8 + 4. */
enum { kCacheL = 8, kCacheR = 4, kCacheW = kCacheL + kCacheR, kCacheBlock = 4 };

/* concat_and_cache_mla with a 0-d scale tensor (any shape of one element is valid) into a
 * NaN-poisoned fp8_e4m3 cache: tokens 0 and 2 land in slots 6 and 1 as e4m3(x / scale), the
 * quotient rounded to f32 first; token 1 (slot -1) and every other slot stay poisoned. With an
 * auto cache the scale's value is unused: a NaN scale succeeds and the entries are copies. */
static void test_concat_tensor_scale(void) {
  enum { kTokens = 3, kBlocks = 2 };
  float kv_c[kTokens * kCacheL], k_pe[kTokens * kCacheR];
  uint32_t state = 21;
  fill_random(kv_c, kTokens * kCacheL, &state);
  fill_random(k_pe, kTokens * kCacheR, &state);
  for (int i = 0; i < kTokens * kCacheL; ++i) kv_c[i] *= 4.0f; /* 4: codes across e4m3's range */
  kv_c[0] = 300.0f;  /* 300 / 0.3 = 1000: saturates to 448 */
  kv_c[1] = -1e-4f;  /* / 0.3 below half the smallest subnormal 2^-9: -0 (0x80) */
  k_pe[2] = 0.0025f; /* / 0.3 = 0.00833: subnormal 4 x 2^-9 */
  int64_t slots[kTokens] = {6, -1, 1};
  float scale_value = 0.3f;

  uint8_t cache[kBlocks * kCacheBlock * kCacheW], expected[kBlocks * kCacheBlock * kCacheW];
  memset(cache, 0x7f, sizeof(cache)); /* 0x7f: an e4m3 NaN */
  memcpy(expected, cache, sizeof(cache));
  for (int t = 0; t < kTokens; ++t) {
    if (slots[t] < 0) continue;
    uint8_t* entry = expected + slots[t] * kCacheW;
    for (int j = 0; j < kCacheL; ++j) {
      entry[j] = e4m3_nearest((float)((double)kv_c[t * kCacheL + j] / scale_value));
    }
    for (int j = 0; j < kCacheR; ++j) {
      entry[kCacheL + j] = e4m3_nearest((float)((double)k_pe[t * kCacheR + j] / scale_value));
    }
  }

  int64_t kv_c_shape[2] = {kTokens, kCacheL}, k_pe_shape[2] = {kTokens, kCacheR};
  int64_t cache_shape[3] = {kBlocks, kCacheBlock, kCacheW}, slots_shape[1] = {kTokens};
  DLTensor t_kv_c = host_tensor(kv_c, kF32, 2, kv_c_shape);
  DLTensor t_k_pe = host_tensor(k_pe, kF32, 2, k_pe_shape);
  DLTensor t_cache = host_tensor(cache, kFp8, 3, cache_shape);
  DLTensor t_slots = host_tensor(slots, (DLDataType){kDLInt, 64, 1}, 1, slots_shape);
  DLTensor t_scale = host_tensor(&scale_value, kF32, 0, NULL);
  CHECK_STATUS(mlakit_concat_and_cache_mla_tensor_scale(&t_kv_c, &t_k_pe, &t_cache, &t_slots,
                                                        MLAKIT_KV_CACHE_FP8_E4M3, &t_scale, NULL),
               MLAKIT_OK, NULL);
  CHECK(memcmp(cache, expected, sizeof(cache)) == 0);
  CHECK(cache[6 * kCacheW] == 0x7e && cache[6 * kCacheW + 1] == 0x80);
  CHECK(cache[6 * kCacheW + kCacheL + 2] == 0x04);

  float auto_cache[kBlocks * kCacheBlock * kCacheW], auto_expected[kBlocks * kCacheBlock * kCacheW];
  for (int i = 0; i < kBlocks * kCacheBlock * kCacheW; ++i) auto_cache[i] = NAN;
  memcpy(auto_expected, auto_cache, sizeof(auto_cache));
  for (int t = 0; t < kTokens; ++t) {
    if (slots[t] < 0) continue;
    memcpy(auto_expected + slots[t] * kCacheW, kv_c + t * kCacheL, kCacheL * sizeof(float));
    memcpy(auto_expected + slots[t] * kCacheW + kCacheL, k_pe + t * kCacheR,
           kCacheR * sizeof(float));
  }
  DLTensor t_auto_cache = host_tensor(auto_cache, kF32, 3, cache_shape);
  scale_value = NAN;
  CHECK_STATUS(mlakit_concat_and_cache_mla_tensor_scale(&t_kv_c, &t_k_pe, &t_auto_cache, &t_slots,
                                                        MLAKIT_KV_CACHE_AUTO, &t_scale, NULL),
               MLAKIT_OK, NULL);
  CHECK(memcmp(auto_cache, auto_expected, sizeof(auto_cache)) == 0);

  /* For fp8_e4m3 the value is checked as the float form checks it. */
  scale_value = 0.0f;
  CHECK_STATUS(mlakit_concat_and_cache_mla_tensor_scale(&t_kv_c, &t_k_pe, &t_cache, &t_slots,
                                                        MLAKIT_KV_CACHE_FP8_E4M3, &t_scale, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT,
               "concat_and_cache_mla: scale must be finite and > 0 for kv_cache_dtype fp8_e4m3, "
               "got 0");
  bad_scale_t bad[kBadScales];
  make_bad_scales(bad);
  for (int i = 0; i < kBadScales; ++i) {
    CHECK_STATUS(mlakit_concat_and_cache_mla_tensor_scale(&t_kv_c, &t_k_pe, &t_cache, &t_slots,
                                                          MLAKIT_KV_CACHE_FP8_E4M3,
                                                          bad_scale_arg(&bad[i]), NULL),
                 bad[i].status, bad_scale_needle("concat_and_cache_mla", &bad[i]));
  }
}

/* gather_and_maybe_dequant_cache of an fp8_e4m3 cache with a [1, 1] scale tensor: row t of dst
 * is request b = token_to_seq[t] at position t - cu_seq_lens[b] + seq_starts[b], each code's
 * value times the scale (exact in double, rounded once to f32). dst is NaN-poisoned; its last
 * row (beyond num_tokens) stays so. */
static void test_gather_tensor_scale(void) {
  enum { kBlocks = 3, kBatch = 2, kRows = 6 };
  uint8_t cache[kBlocks * kCacheBlock * kCacheW];
  uint32_t state = 23;
  fill_random_codes(cache, kBlocks * kCacheBlock * kCacheW, &state);
  /* Request 0: positions 2..4 (blocks 2, 0); request 1: positions 1..3 (block 1). */
  int32_t table[kBatch][2] = {{2, 0}, {1, 2}};
  int32_t cu_seq_lens[kBatch + 1] = {0, 3, 6};
  int32_t token_to_seq[kRows] = {0, 0, 0, 1, 1, 1};
  int32_t seq_starts[kBatch] = {2, 1};
  float scale_value = 0.7f;

  float dst[(kRows + 1) * kCacheW], expected[(kRows + 1) * kCacheW];
  for (int i = 0; i < (kRows + 1) * kCacheW; ++i) dst[i] = NAN;
  memcpy(expected, dst, sizeof(dst));
  for (int t = 0; t < kRows; ++t) {
    const int b = token_to_seq[t];
    const int position = t - cu_seq_lens[b] + seq_starts[b];
    const int slot = table[b][position / kCacheBlock] * kCacheBlock + position % kCacheBlock;
    for (int j = 0; j < kCacheW; ++j) {
      expected[t * kCacheW + j] = (float)(e4m3_value(cache[slot * kCacheW + j]) * scale_value);
    }
  }

  int64_t cache_shape[3] = {kBlocks, kCacheBlock, kCacheW}, dst_shape[2] = {kRows + 1, kCacheW};
  int64_t table_shape[2] = {kBatch, 2}, cu_shape[1] = {kBatch + 1}, rows_shape[1] = {kRows};
  int64_t starts_shape[1] = {kBatch}, scale_shape[2] = {1, 1};
  const DLDataType i32 = {kDLInt, 32, 1};
  DLTensor t_cache = host_tensor(cache, kFp8, 3, cache_shape);
  DLTensor t_dst = host_tensor(dst, kF32, 2, dst_shape);
  DLTensor t_table = host_tensor(table, i32, 2, table_shape);
  DLTensor t_cu = host_tensor(cu_seq_lens, i32, 1, cu_shape);
  DLTensor t_token_to_seq = host_tensor(token_to_seq, i32, 1, rows_shape);
  DLTensor t_starts = host_tensor(seq_starts, i32, 1, starts_shape);
  DLTensor t_scale = host_tensor(&scale_value, kF32, 2, scale_shape);
  CHECK_STATUS(mlakit_gather_and_maybe_dequant_cache_tensor_scale(
                   &t_cache, &t_dst, &t_table, &t_cu, &t_token_to_seq, kRows,
                   MLAKIT_KV_CACHE_FP8_E4M3, &t_scale, &t_starts, NULL),
               MLAKIT_OK, NULL);
  CHECK(memcmp(dst, expected, sizeof(dst)) == 0);

  scale_value = NAN;
  CHECK_STATUS(mlakit_gather_and_maybe_dequant_cache_tensor_scale(
                   &t_cache, &t_dst, &t_table, &t_cu, &t_token_to_seq, kRows,
                   MLAKIT_KV_CACHE_FP8_E4M3, &t_scale, &t_starts, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT,
               "gather_and_maybe_dequant_cache: scale must be finite and > 0 for kv_cache_dtype "
               "fp8_e4m3, got nan");
  bad_scale_t bad[kBadScales];
  make_bad_scales(bad);
  for (int i = 0; i < kBadScales; ++i) {
    CHECK_STATUS(mlakit_gather_and_maybe_dequant_cache_tensor_scale(
                     &t_cache, &t_dst, &t_table, &t_cu, &t_token_to_seq, kRows,
                     MLAKIT_KV_CACHE_FP8_E4M3, bad_scale_arg(&bad[i]), &t_starts, NULL),
                 bad[i].status, bad_scale_needle("gather_and_maybe_dequant_cache", &bad[i]));
  }
}

/* scaled_fp8_quant with a [1] scale tensor: out = e4m3(x * (1 / scale)), the reciprocal and the
 * product rounded to f32 (mlakit.h), into NaN-poisoned codes. */
static void test_fp8_quant_tensor_scale(void) {
  enum { kRows = 2, kCols = 8, kCount = kRows * kCols };
  float x[kCount];
  uint32_t state = 25;
  fill_random(x, kCount, &state);
  for (int i = 0; i < kCount; ++i) x[i] *= 100.0f; /* 100: / 0.37 spans e4m3's range */
  x[0] = 1000.0f;                                  /* 1000 / 0.37 = 2703: saturates to 448 */
  x[1] = -2e-5f;                                   /* tiny: rounds to -0 (0x80) */
  float scale_value = 0.37f;
  const float inv_scale = 1.0f / scale_value;
  uint8_t out[kCount], expected[kCount];
  memset(out, 0x7f, sizeof(out)); /* 0x7f: an e4m3 NaN */
  for (int i = 0; i < kCount; ++i) expected[i] = e4m3_nearest((float)((double)x[i] * inv_scale));

  int64_t shape[2] = {kRows, kCols}, scale_shape[1] = {1};
  DLTensor t_x = host_tensor(x, kF32, 2, shape);
  DLTensor t_out = host_tensor(out, kFp8, 2, shape);
  DLTensor t_scale = host_tensor(&scale_value, kF32, 1, scale_shape);
  CHECK_STATUS(mlakit_scaled_fp8_quant_tensor_scale(&t_x, &t_out, &t_scale, NULL), MLAKIT_OK, NULL);
  CHECK(memcmp(out, expected, sizeof(out)) == 0);
  CHECK(out[0] == 0x7e && out[1] == 0x80);

  /* Halfway cases under scale 0.5 (an exact reciprocal): x * 2 lies midway between two codes and
   * goes to the even one, in the library and in the reference. */
  float ties[6] = {0.53125f, 0.59375f, 0x1p-11f, 0x1.8p-10f, 200.0f, -216.0f};
  /* 1.0625 -> 1 (0x38), 1.1875 -> 1.25 (0x3a), 2^-10 -> 0, 1.5 x 2^-9 -> 2 x 2^-9 (0x02),
   * 400 -> 384 (0x7c), -432 -> -448 (0xfe). */
  const uint8_t tie_codes[6] = {0x38, 0x3a, 0x00, 0x02, 0x7c, 0xfe};
  uint8_t tie_out[6];
  memset(tie_out, 0x7f, sizeof(tie_out));
  int64_t ties_shape[1] = {6};
  DLTensor t_ties = host_tensor(ties, kF32, 1, ties_shape);
  DLTensor t_tie_out = host_tensor(tie_out, kFp8, 1, ties_shape);
  scale_value = 0.5f;
  CHECK_STATUS(mlakit_scaled_fp8_quant_tensor_scale(&t_ties, &t_tie_out, &t_scale, NULL), MLAKIT_OK,
               NULL);
  CHECK(memcmp(tie_out, tie_codes, sizeof(tie_out)) == 0);
  for (int i = 0; i < 6; ++i) CHECK(e4m3_nearest(2.0 * ties[i]) == tie_codes[i]);

  scale_value = 1e-40f; /* a subnormal: its reciprocal overflows f32 */
  CHECK_STATUS(mlakit_scaled_fp8_quant_tensor_scale(&t_x, &t_out, &t_scale, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT,
               "scaled_fp8_quant: scale must be finite and > 0 with a finite reciprocal");
  bad_scale_t bad[kBadScales];
  make_bad_scales(bad);
  for (int i = 0; i < kBadScales; ++i) {
    CHECK_STATUS(mlakit_scaled_fp8_quant_tensor_scale(&t_x, &t_out, bad_scale_arg(&bad[i]), NULL),
                 bad[i].status, bad_scale_needle("scaled_fp8_quant", &bad[i]));
  }
}

/* dynamic_scaled_fp8_quant: scale = amax(|x|) / 448 (f32 division: the double quotient rounded
 * once), then the codes of the static quant with it; the amax element maps to -448. An all-zero
 * input gives scale 0 and codes 0; an inf input writes scale inf, fails and leaves out as it
 * was. Scale and out are NaN-poisoned before each call. */
static void test_dynamic_fp8_quant(void) {
  enum { kRows = 3, kCols = 5, kCount = kRows * kCols };
  float x[kCount];
  uint32_t state = 27;
  fill_random(x, kCount, &state);
  for (int i = 0; i < kCount; ++i) x[i] *= 3.0f; /* 3: below the amax element */
  x[7] = -6.5f;
  double amax = 0.0;
  for (int i = 0; i < kCount; ++i) amax = fmax(amax, fabs(x[i]));
  const float expected_scale = (float)(amax / 448.0);
  const float inv_scale = 1.0f / expected_scale;
  uint8_t out[kCount], expected[kCount];
  for (int i = 0; i < kCount; ++i) expected[i] = e4m3_nearest((float)((double)x[i] * inv_scale));
  float scale_value = NAN;
  memset(out, 0x7f, sizeof(out)); /* 0x7f: an e4m3 NaN */

  int64_t shape[2] = {kRows, kCols}, scale_shape[1] = {1};
  DLTensor t_x = host_tensor(x, kF32, 2, shape);
  DLTensor t_out = host_tensor(out, kFp8, 2, shape);
  DLTensor t_scale = host_tensor(&scale_value, kF32, 1, scale_shape);
  CHECK_STATUS(mlakit_dynamic_scaled_fp8_quant(&t_x, &t_out, &t_scale, NULL), MLAKIT_OK, NULL);
  CHECK(scale_value == expected_scale);
  CHECK(memcmp(out, expected, sizeof(out)) == 0);
  CHECK(out[7] == 0xfe);

  float zeros[kCount];
  for (int i = 0; i < kCount; ++i) zeros[i] = i % 2 == 0 ? 0.0f : -0.0f;
  DLTensor t_zeros = host_tensor(zeros, kF32, 2, shape);
  scale_value = NAN;
  memset(out, 0x7f, sizeof(out));
  CHECK_STATUS(mlakit_dynamic_scaled_fp8_quant(&t_zeros, &t_out, &t_scale, NULL), MLAKIT_OK, NULL);
  CHECK(scale_value == 0.0f);
  uint8_t all_zero[kCount];
  memset(all_zero, 0, sizeof(all_zero));
  CHECK(memcmp(out, all_zero, sizeof(out)) == 0);

  const float kept = x[3];
  x[3] = INFINITY;
  scale_value = NAN;
  memset(out, 0x7f, sizeof(out));
  uint8_t poisoned[kCount];
  memcpy(poisoned, out, sizeof(out));
  CHECK_STATUS(mlakit_dynamic_scaled_fp8_quant(&t_x, &t_out, &t_scale, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT,
               "dynamic_scaled_fp8_quant: the scale amax(|input|) / 448 = inf has no finite "
               "reciprocal");
  CHECK(isinf(scale_value) && scale_value > 0);
  CHECK(memcmp(out, poisoned, sizeof(out)) == 0);
  x[3] = kept; /* a valid input again: the calls below fail for their scale only */

  CHECK_STATUS(mlakit_dynamic_scaled_fp8_quant(NULL, &t_out, &t_scale, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT, "dynamic_scaled_fp8_quant: input must not be NULL");
  bad_scale_t bad[kBadScales];
  make_bad_scales(bad);
  for (int i = 0; i < kBadScales; ++i) {
    CHECK_STATUS(mlakit_dynamic_scaled_fp8_quant(&t_x, &t_out, bad_scale_arg(&bad[i]), NULL),
                 bad[i].status, bad_scale_needle("dynamic_scaled_fp8_quant", &bad[i]));
  }
}

/* Small layer dimensions (N, L, R, P, V) and the step: request 0 decodes 1 token after 4 cached
 * ones (blocks 0, 1), request 1 prefills 3 tokens (block 2). */
enum { kN = 2, kL = 32, kR = 8, kP = 16, kV = 16, kBlock = 4, kBlocks = 4, kT = 4 };

static mlakit_mla_config_t step_config(void) {
  mlakit_mla_config_t config;
  mlakit_mla_config_init(&config);
  config.num_heads = kN;
  config.kv_lora_rank = kL;
  config.qk_rope_head_dim = kR;
  config.qk_nope_head_dim = kP;
  config.v_head_dim = kV;
  config.scale = 0.25f;
  config.act_dtype = kF32;
  config.block_size = kBlock;
  config.max_model_len = 16;
  config.max_num_seqs = 2;
  config.max_num_batched_tokens = 8;
  return config;
}

static void test_step(void) {
  mlakit_mla_config_t defaults;
  mlakit_mla_config_init(&defaults);
  CHECK(defaults.max_num_batched_tokens == 8192 && defaults.batch_invariant == 0);

  mlakit_mla_config_t config = step_config();
  int64_t bytes = 0;
  config.batch_invariant = 2;
  CHECK_STATUS(mlakit_workspace_bytes(&config, &bytes), MLAKIT_ERROR_INVALID_ARGUMENT,
               "workspace_bytes: config.batch_invariant must be 0 or 1, got 2");
  config.batch_invariant = 0;
  CHECK_STATUS(mlakit_workspace_bytes(&config, &bytes), MLAKIT_OK, NULL);
  CHECK(bytes > 0);
  mlakit_workspace_t* ws = NULL;
  CHECK_STATUS(mlakit_workspace_create(&config, &ws), MLAKIT_OK, NULL);
  int64_t ws_bytes = 0;
  CHECK_STATUS(mlakit_workspace_get_bytes(ws, &ws_bytes), MLAKIT_OK, NULL);
  CHECK(ws_bytes == bytes);
  CHECK_STATUS(mlakit_workspace_touch(ws, NULL), MLAKIT_OK, NULL);

  static float weights[2][kN * (kP + kV) * kL];
  static float q[kT * kN * (kP + kR)], kv_c[kT * kL], k_pe[kT * kR];
  static float cache[2][kBlocks * kBlock * (kL + kR)],
      cache_single[2][kBlocks * kBlock * (kL + kR)];
  static float out_step[2][kT * kN * kV], out_single[2][kT * kN * kV];
  uint32_t state = 7;
  fill_random(&weights[0][0], 2 * kN * (kP + kV) * kL, &state);
  fill_random(q, kT * kN * (kP + kR), &state);
  fill_random(kv_c, kT * kL, &state);
  fill_random(k_pe, kT * kR, &state);
  fill_random(&cache[0][0], 2 * kBlocks * kBlock * (kL + kR), &state);
  memcpy(cache_single, cache, sizeof(cache));

  int64_t w_shape[2] = {kN * (kP + kV), kL}, q_shape[3] = {kT, kN, kP + kR};
  int64_t kv_c_shape[2] = {kT, kL}, k_pe_shape[2] = {kT, kR};
  int64_t cache_shape[3] = {kBlocks, kBlock, kL + kR}, out_shape[2] = {kT, kN * kV};
  int32_t table[2][2] = {{0, 1}, {2, 3}};
  int64_t table_shape[2] = {2, 2};
  int64_t slots[kT] = {4, 8, 9, 10};
  int64_t slots_shape[1] = {kT};
  const int32_t qsl[3] = {0, 1, 4};
  const int32_t seq_lens[2] = {5, 3};
  DLTensor t_table = host_tensor(table, (DLDataType){kDLInt, 32, 1}, 2, table_shape);
  DLTensor t_slots = host_tensor(slots, (DLDataType){kDLInt, 64, 1}, 1, slots_shape);
  const mlakit_forward_batch_t batch = {qsl, seq_lens, 2, kT, &t_table, &t_slots};
  DLTensor t_q = host_tensor(q, kF32, 3, q_shape);
  DLTensor t_kv_c = host_tensor(kv_c, kF32, 2, kv_c_shape);
  DLTensor t_k_pe = host_tensor(k_pe, kF32, 2, k_pe_shape);

  mlakit_attention_t* layers[2] = {NULL, NULL};
  mlakit_step_plan_t* plan = NULL;
  CHECK_STATUS(mlakit_plan_step(&config, &batch, ws, NULL, &plan), MLAKIT_OK, NULL);
  mlakit_step_plan_info_t info;
  CHECK_STATUS(mlakit_step_plan_get_info(plan, &info), MLAKIT_OK, NULL);
  CHECK(info.num_reqs == 2 && info.num_actual_tokens == kT && info.num_context_chunks == 0);
  CHECK(info.split.num_decodes == 1 && info.split.num_prefills == 1);
  CHECK(info.split.num_decode_tokens == 1 && info.split.num_prefill_tokens == 3);
  CHECK(info.workspace_bytes_used > 0 && info.workspace_bytes_used <= ws_bytes);
  mlakit_plan_t* copy = NULL;
  CHECK_STATUS(mlakit_step_plan_get_plan(plan, &copy), MLAKIT_OK, NULL);
  mlakit_plan_summary_t summary;
  CHECK_STATUS(mlakit_plan_get_summary(copy, &summary), MLAKIT_OK, NULL);
  CHECK(summary.split.num_prefill_tokens == 3 && summary.prefill_max_query_len == 3);
  mlakit_plan_destroy(copy);

  /* Two layers, one plan: each output equals the layer's single-call forward bit for bit. */
  for (int i = 0; i < 2; ++i) {
    DLTensor t_w = host_tensor(weights[i], kF32, 2, w_shape);
    CHECK_STATUS(mlakit_attention_create(&config, &t_w, NULL, &layers[i]), MLAKIT_OK, NULL);
    DLTensor t_cache = host_tensor(cache[i], kF32, 3, cache_shape);
    DLTensor t_out = host_tensor(out_step[i], kF32, 2, out_shape);
    CHECK_STATUS(mlakit_attention_forward_step(layers[i], &t_q, &t_kv_c, &t_k_pe, &t_cache, plan,
                                               &t_out, 1.0f, 1.0f, NULL),
                 MLAKIT_OK, NULL);
    DLTensor t_cache_single = host_tensor(cache_single[i], kF32, 3, cache_shape);
    DLTensor t_out_single = host_tensor(out_single[i], kF32, 2, out_shape);
    CHECK_STATUS(mlakit_attention_forward(layers[i], &t_q, &t_kv_c, &t_k_pe, &t_cache_single,
                                          &batch, &t_out_single, 1.0f, 1.0f, NULL),
                 MLAKIT_OK, NULL);
    CHECK(memcmp(out_step[i], out_single[i], sizeof(out_step[i])) == 0);
    CHECK(memcmp(cache[i], cache_single[i], sizeof(cache[i])) == 0);
  }
  CHECK(memcmp(out_step[0], out_step[1], sizeof(out_step[0])) != 0); /* the weights differ */

  /* A second plan of the same step: same launches; the first is now stale. The workspace handle
   * may go before its plans. */
  mlakit_step_plan_t* next = NULL;
  CHECK_STATUS(mlakit_plan_step(&config, &batch, ws, NULL, &next), MLAKIT_OK, NULL);
  int32_t same = -1;
  CHECK_STATUS(mlakit_step_plan_same_launches(plan, next, &same), MLAKIT_OK, NULL);
  CHECK(same == 1);
  mlakit_workspace_destroy(ws);
  DLTensor t_cache = host_tensor(cache[0], kF32, 3, cache_shape);
  DLTensor t_out = host_tensor(out_step[0], kF32, 2, out_shape);
  CHECK_STATUS(mlakit_attention_forward_step(layers[0], &t_q, &t_kv_c, &t_k_pe, &t_cache, plan,
                                             &t_out, 1.0f, 1.0f, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT, "MlaAttention::forward: the StepPlan is stale");
  CHECK_STATUS(mlakit_attention_forward_step(layers[0], &t_q, &t_kv_c, &t_k_pe, &t_cache, next,
                                             &t_out, 1.0f, 1.0f, NULL),
               MLAKIT_OK, NULL);
  /* Stress findings: an output over q or over the cache, or over itself, ran with status OK and
   * a wrong output; both forms refuse it now. An auto cache ignores the fp8 scales, NaN included
   * (they were refused under mla_decode's name): the output is that of scales 1. */
  {
    DLTensor over_q = host_tensor(q, kF32, 2, out_shape);
    CHECK_STATUS(mlakit_attention_forward_step(layers[0], &t_q, &t_kv_c, &t_k_pe, &t_cache, next,
                                               &over_q, 1.0f, 1.0f, NULL),
                 MLAKIT_ERROR_INVALID_ARGUMENT, "MlaAttention::forward: output must not overlap q");
    DLTensor over_cache = host_tensor(cache[0], kF32, 2, out_shape);
    CHECK_STATUS(mlakit_attention_forward(layers[0], &t_q, &t_kv_c, &t_k_pe, &t_cache, &batch,
                                          &over_cache, 1.0f, 1.0f, NULL),
                 MLAKIT_ERROR_INVALID_ARGUMENT,
                 "MlaAttention::forward: output must not overlap kv_cache");
    int64_t one_row[2] = {0, 1};
    DLTensor same_row = host_tensor(out_single[1], kF32, 2, out_shape);
    same_row.strides = one_row;
    CHECK_STATUS(mlakit_attention_forward_step(layers[0], &t_q, &t_kv_c, &t_k_pe, &t_cache, next,
                                               &same_row, 1.0f, 1.0f, NULL),
                 MLAKIT_ERROR_INVALID_ARGUMENT,
                 "MlaAttention::forward: output must not overlap itself");
    static float out_nan_scales[kT * kN * kV];
    DLTensor t_out_nan = host_tensor(out_nan_scales, kF32, 2, out_shape);
    CHECK_STATUS(mlakit_attention_forward_step(layers[0], &t_q, &t_kv_c, &t_k_pe, &t_cache, next,
                                               &t_out_nan, NAN, NAN, NULL),
                 MLAKIT_OK, NULL);
    CHECK(memcmp(out_nan_scales, out_step[0], sizeof(out_nan_scales)) == 0);
  }
  CHECK_STATUS(mlakit_attention_forward_step(layers[0], &t_q, &t_kv_c, &t_k_pe, &t_cache, NULL,
                                             &t_out, 1.0f, 1.0f, NULL),
               MLAKIT_ERROR_INVALID_ARGUMENT, "MlaAttention::forward: plan must not be NULL");
  mlakit_step_plan_destroy(plan);
  mlakit_step_plan_destroy(next);

  /* A step beyond the limits the workspace was sized for. */
  CHECK_STATUS(mlakit_workspace_create(&config, &ws), MLAKIT_OK, NULL);
  const int32_t long_lens[2] = {17, 3}; /* max_model_len is 16 */
  const mlakit_forward_batch_t too_long = {qsl, long_lens, 2, kT, &t_table, &t_slots};
  plan = NULL;
  CHECK_STATUS(mlakit_plan_step(&config, &too_long, ws, NULL, &plan), MLAKIT_ERROR_INVALID_ARGUMENT,
               "plan_step: seq_lens[0] (17) exceeds max_model_len");
  CHECK(plan == NULL);
  mlakit_workspace_destroy(ws);
  mlakit_attention_destroy(layers[0]);
  mlakit_attention_destroy(layers[1]);
}

/* What the failing all_gather callback of test_dcp saw. */
typedef struct gather_call {
  int calls;
  int64_t count;
  DLDataType dtype;
} gather_call_t;

static int32_t failing_all_gather(void* user_data, const void* send, void* recv, int64_t count,
                                  DLDataType dtype, void* stream) {
  gather_call_t* seen = (gather_call_t*)user_data;
  (void)send;
  (void)recv;
  (void)stream;
  ++seen->calls;
  seen->count = count;
  seen->dtype = dtype;
  return 7; /* any non-zero value is a failure */
}

static int32_t unused_reduce_scatter(void* user_data, const void* send, void* recv,
                                     int64_t recv_count, DLDataType dtype, void* stream) {
  (void)user_data;
  (void)send;
  (void)recv;
  (void)recv_count;
  (void)dtype;
  (void)stream;
  return 0;
}

/* A DCP layer (rank 0 of 2) over a callback communicator: the configuration and communicator
 * checks, and a collective that fails in the caller's callback. (The collectives' results are
 * tested with real ranks from Python: python/tests/test_dcp_layer.py.) */
static void test_dcp(void) {
  mlakit_mla_config_t config = step_config();
  mlakit_mla_config_t defaults;
  mlakit_mla_config_init(&defaults);
  CHECK(defaults.dcp_world_size == 1 && defaults.dcp_rank == 0 && defaults.dcp_interleave == 1);
  config.dcp_world_size = 2;

  gather_call_t seen = {0, 0, {0, 0, 0}};
  mlakit_communicator_callbacks_t callbacks = {
      1, 2, {kDLCPU, 0}, failing_all_gather, unused_reduce_scatter, &seen};
  mlakit_communicator_t* comm = NULL;
  callbacks.rank = 2;
  CHECK_STATUS(mlakit_communicator_create(&callbacks, &comm), MLAKIT_ERROR_INVALID_ARGUMENT,
               "callbacks.rank must be in [0, world_size = 2), got 2");
  CHECK(comm == NULL);
  callbacks.rank = 1;
  callbacks.all_gather = NULL;
  CHECK_STATUS(mlakit_communicator_create(&callbacks, &comm), MLAKIT_ERROR_INVALID_ARGUMENT,
               "callbacks.all_gather must not be NULL");
  callbacks.all_gather = failing_all_gather;
  CHECK_STATUS(mlakit_communicator_create(&callbacks, &comm), MLAKIT_OK, NULL);

  static float weight[kN * (kP + kV) * kL];
  uint32_t state = 11;
  fill_random(weight, kN * (kP + kV) * kL, &state);
  int64_t w_shape[2] = {kN * (kP + kV), kL};
  DLTensor t_w = host_tensor(weight, kF32, 2, w_shape);
  mlakit_attention_t* layer = NULL;
  CHECK_STATUS(mlakit_attention_create(&config, &t_w, NULL, &layer), MLAKIT_ERROR_INVALID_ARGUMENT,
               "dcp.world_size is 2 but no communicator was given");
  CHECK_STATUS(mlakit_attention_create_dcp(&config, &t_w, NULL, comm, &layer),
               MLAKIT_ERROR_INVALID_ARGUMENT,
               "the communicator is rank 1 of 2, but the configuration says dcp.rank 0");
  config.dcp_rank = 2;
  CHECK_STATUS(mlakit_attention_create_dcp(&config, &t_w, NULL, comm, &layer),
               MLAKIT_ERROR_INVALID_ARGUMENT,
               "DcpConfig: rank must be in [0, world_size = 2), got 2");
  config.dcp_rank = 1;
  CHECK_STATUS(mlakit_attention_create_dcp(&config, &t_w, NULL, comm, &layer), MLAKIT_OK, NULL);

  /* Request 0 decodes its 5th token (rank 1 holds positions 1 and 3: block 0), request 1
   * prefills 3 tokens (rank 1 holds position 1: block 2). slot_mapping is empty under DCP. */
  static float q[kT * kN * (kP + kR)], kv_c[kT * kL], k_pe[kT * kR];
  static float cache[kBlocks * kBlock * (kL + kR)], out[kT * kN * kV];
  fill_random(q, kT * kN * (kP + kR), &state);
  fill_random(kv_c, kT * kL, &state);
  fill_random(k_pe, kT * kR, &state);
  fill_random(cache, kBlocks * kBlock * (kL + kR), &state);
  int64_t q_shape[3] = {kT, kN, kP + kR}, kv_c_shape[2] = {kT, kL}, k_pe_shape[2] = {kT, kR};
  int64_t cache_shape[3] = {kBlocks, kBlock, kL + kR}, out_shape[2] = {kT, kN * kV};
  int32_t table[2][1] = {{0}, {2}};
  int64_t table_shape[2] = {2, 1};
  int64_t no_slots_shape[1] = {0};
  const int32_t qsl[3] = {0, 1, 4};
  const int32_t seq_lens[2] = {5, 3};
  DLTensor t_table = host_tensor(table, (DLDataType){kDLInt, 32, 1}, 2, table_shape);
  DLTensor t_slots = host_tensor(NULL, (DLDataType){kDLInt, 64, 1}, 1, no_slots_shape);
  const mlakit_forward_batch_t batch = {qsl, seq_lens, 2, kT, &t_table, &t_slots};
  DLTensor t_q = host_tensor(q, kF32, 3, q_shape);
  DLTensor t_kv_c = host_tensor(kv_c, kF32, 2, kv_c_shape);
  DLTensor t_k_pe = host_tensor(k_pe, kF32, 2, k_pe_shape);
  DLTensor t_cache = host_tensor(cache, kF32, 3, cache_shape);
  DLTensor t_out = host_tensor(out, kF32, 2, out_shape);
  /* The first collective is the decode's all-gather of the absorbed queries: 1 token x N heads x
   * (L + R) f32. */
  CHECK_STATUS(mlakit_attention_forward(layer, &t_q, &t_kv_c, &t_k_pe, &t_cache, &batch, &t_out,
                                        1.0f, 1.0f, NULL),
               MLAKIT_ERROR_BACKEND,
               "Communicator::all_gather: the caller's all_gather callback failed (returned 7");
  CHECK(seen.calls == 1 && seen.count == 1 * kN * (kL + kR));
  CHECK(seen.dtype.code == kDLFloat && seen.dtype.bits == 32 && seen.dtype.lanes == 1);
  mlakit_attention_destroy(layer);
  mlakit_communicator_destroy(comm);
}

/* The library's decode schedules: a batch-invariant CPU one for {2500, 10} with block 16 cuts
 * request 0 into ceil(2500 / 1024) = 3 pieces and leaves request 1 whole, 4 splits in all; the
 * workspace holds one 512 + 1 row per split and head. A CUDA schedule needs no seq_lens. */
static void test_decode_planning(void) {
  const int32_t seq_lens[2] = {2500, 10};
  mlakit_decode_plan_shape_t shape = {{kDLCPU, 0}, 2, 1, 4, 16, 4096, 1};
  mlakit_decode_schedule_t* schedule = NULL;
  CHECK_STATUS(mlakit_plan_mla_decode(&shape, seq_lens, &schedule), MLAKIT_OK, NULL);
  int64_t total = 0, most = 0, elems = 0;
  CHECK_STATUS(mlakit_decode_schedule_info(schedule, &total, &most), MLAKIT_OK, NULL);
  CHECK(total == 4 && most == 3);
  CHECK_STATUS(mlakit_decode_workspace_elems(schedule, 1, 4, 512, &elems), MLAKIT_OK, NULL);
  CHECK(elems == 4 * 4 * 513);
  mlakit_decode_schedule_destroy(schedule);
  schedule = NULL;
  CHECK_STATUS(mlakit_plan_mla_decode(&shape, NULL, &schedule), MLAKIT_ERROR_INVALID_ARGUMENT,
               "seq_lens must have batch (2) entries, got 0");
  CHECK(schedule == NULL);
  CHECK_STATUS(mlakit_plan_mla_decode(NULL, seq_lens, &schedule), MLAKIT_ERROR_INVALID_ARGUMENT,
               "shape must not be NULL");
  /* The CPU has the lengths: one above shape.max_seq_len is refused at the call (stress finding:
   * it was accepted; the GPU reports it as a bad index when the kernel runs). */
  shape.max_seq_len = 2499;
  CHECK_STATUS(mlakit_plan_mla_decode(&shape, seq_lens, &schedule), MLAKIT_ERROR_INVALID_ARGUMENT,
               "plan_mla_decode: seq_lens[0] (2500) exceeds shape.max_seq_len (2499)");
  CHECK(schedule == NULL);
  shape.max_seq_len = 4096;
  if (strstr(mlakit_build_info(), "\"cuda\": false") != NULL) {
    shape.device.device_type = kDLCUDA;
    CHECK_STATUS(mlakit_plan_mla_decode(&shape, NULL, &schedule), MLAKIT_ERROR_UNSUPPORTED,
                 "plan_mla_decode: no kernel for cuda:0");
  }
}

static void test_device_errors(void) {
  /* Host devices have nothing recorded: CPU ops throw at the bad index itself. */
  CHECK_STATUS(mlakit_check_device_errors(kDLCPU, 0, NULL), MLAKIT_OK, NULL);
  CHECK_STATUS(mlakit_check_device_errors(kDLCUDAHost, 0, NULL), MLAKIT_OK, NULL);
  CHECK_STATUS(mlakit_check_device_errors(kDLCUDA, -1, NULL), MLAKIT_ERROR_INVALID_ARGUMENT,
               "negative CUDA device id");
  CHECK_STATUS(mlakit_check_device_errors(kDLMetal, 0, NULL), MLAKIT_ERROR_UNSUPPORTED,
               "DLPack device type");
}

int main(void) {
  test_version();
  test_errors();
  test_planner();
  test_decode_planning();
  test_merge();
  test_fp8_quant();
  test_concat_tensor_scale();
  test_gather_tensor_scale();
  test_fp8_quant_tensor_scale();
  test_dynamic_fp8_quant();
  test_device_errors();
  test_step();
  test_dcp();
  printf("capi_test: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
