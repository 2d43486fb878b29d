/* The C ABI from plain C: version queries, error reporting (status and message text), a planner
 * call and two small ops against results computed by hand. */
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
  CHECK(strstr(info, "\"blas\": \"openblas\"") != NULL);
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
  test_device_errors();
  printf("capi_test: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
