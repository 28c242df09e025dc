// llama_peer: times llama.cpp's CPU backend on a GGUF model, side by side with Tandem.
//
// Built by bench/llama_cpp_peer.sh against the prebuilt libraries of the npm package
// node-llama-cpp (libllama, libggml, libggml-base; the CPU backend variant for this machine
// is loaded at run time from the same directory) and the headers of its bundled source.
// Only the benchmark uses it; Tandem never links llama.cpp.
//
//   llama_peer bench --model M.gguf [--threads 2] [--batches 1,4,16,64] [--context 8]
//              [--steps 16] [--prefill_tokens 128] [--prefill_reps 3] [--seed 1]
//              [--label NAME] [--flash_attn auto|on|off] [--kv_unified 0|1]
//   llama_peer quantize IN.gguf OUT.gguf Q8_0|Q4_0|Q4_K_M|BF16 [--threads 2]
//   llama_peer generate --model M.gguf --prompt TEXT [--max_tokens 16] [--threads 2]
//
// bench: for each batch size B, B sequences each prefilled with --context random token ids
// (>= 3, below the vocabulary size) in one llama_decode, then 2 untimed and --steps timed
// decode steps, each one llama_decode of one token for every sequence (the greedy choice of
// the previous step), timed around llama_decode; then --prefill_reps prefills of one
// --prefill_tokens prompt into an empty cache. One JSON line per measurement on stdout
// (they start with '{'), then a markdown table. Decode tokens/s is B / median step time,
// as tandem_engine_bench reports it; the JSON also has B * steps / total time. Prefill
// tokens/s is from the median of the repetitions; the JSON also has the best.
//
// One ggml threadpool of --threads threads serves every llama_decode (a persistent pool, as
// llama.cpp's own tools use; without one each call starts its threads anew).

#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

typedef struct ggml_threadpool* (*ThreadpoolNewFn)(struct ggml_threadpool_params* params);
typedef void (*ThreadpoolFreeFn)(struct ggml_threadpool* threadpool);

enum { kMaxBatches = 32, kUntimedSteps = 2 };

typedef struct {
  const char* model;
  const char* label;
  const char* prompt;
  int threads;
  int batches[kMaxBatches];
  int num_batches;
  int context;
  int steps;
  int prefill_tokens;
  int prefill_reps;
  int max_tokens;
  uint64_t seed;
  enum llama_flash_attn_type flash_attn;
  bool kv_unified;
  bool verbose;
} Options;

static bool g_verbose = false;

static void Log(enum ggml_log_level level, const char* text, void* user_data) {
  (void)user_data;
  if (g_verbose || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static void Die(const char* message) {
  fprintf(stderr, "llama_peer: %s\n", message);
  exit(1);
}

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int CompareDoubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// Median of n values; sorts them.
static double Median(double* values, int n) {
  qsort(values, (size_t)n, sizeof(double), CompareDoubles);
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

static uint64_t XorShift(uint64_t* state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static llama_token Argmax(const float* logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

static int ParseInt(const char* flag, const char* value, int min) {
  char* end = NULL;
  const long v = strtol(value, &end, 10);
  if (*value == '\0' || *end != '\0' || v < min || v > 1 << 30) {
    fprintf(stderr, "llama_peer: %s wants an integer >= %d, got \"%s\"\n", flag, min, value);
    exit(2);
  }
  return (int)v;
}

static void ParseBatches(const char* text, Options* o) {
  char* copy = strdup(text);
  o->num_batches = 0;
  for (char* part = strtok(copy, ","); part != NULL; part = strtok(NULL, ",")) {
    if (o->num_batches == kMaxBatches) Die("--batches lists too many sizes");
    o->batches[o->num_batches++] = ParseInt("--batches", part, 1);
  }
  free(copy);
  if (o->num_batches == 0) Die("--batches is empty");
}

static void ParseFlags(int argc, char** argv, Options* o) {
  for (int i = 0; i < argc; ++i) {
    const char* flag = argv[i];
    if (strcmp(flag, "--verbose") == 0) {
      o->verbose = true;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "llama_peer: %s needs a value\n", flag);
      exit(2);
    }
    const char* value = argv[++i];
    if (strcmp(flag, "--model") == 0) {
      o->model = value;
    } else if (strcmp(flag, "--label") == 0) {
      o->label = value;
    } else if (strcmp(flag, "--prompt") == 0) {
      o->prompt = value;
    } else if (strcmp(flag, "--threads") == 0) {
      o->threads = ParseInt(flag, value, 1);
    } else if (strcmp(flag, "--batches") == 0) {
      ParseBatches(value, o);
    } else if (strcmp(flag, "--context") == 0) {
      o->context = ParseInt(flag, value, 1);
    } else if (strcmp(flag, "--steps") == 0) {
      o->steps = ParseInt(flag, value, 1);
    } else if (strcmp(flag, "--prefill_tokens") == 0) {
      o->prefill_tokens = ParseInt(flag, value, 0);
    } else if (strcmp(flag, "--prefill_reps") == 0) {
      o->prefill_reps = ParseInt(flag, value, 1);
    } else if (strcmp(flag, "--max_tokens") == 0) {
      o->max_tokens = ParseInt(flag, value, 1);
    } else if (strcmp(flag, "--seed") == 0) {
      o->seed = (uint64_t)ParseInt(flag, value, 0);
    } else if (strcmp(flag, "--kv_unified") == 0) {
      o->kv_unified = ParseInt(flag, value, 0) != 0;
    } else if (strcmp(flag, "--flash_attn") == 0) {
      if (strcmp(value, "auto") == 0) {
        o->flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
      } else if (strcmp(value, "on") == 0) {
        o->flash_attn = LLAMA_FLASH_ATTN_TYPE_ENABLED;
      } else if (strcmp(value, "off") == 0) {
        o->flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;
      } else {
        Die("--flash_attn is auto, on or off");
      }
    } else {
      fprintf(stderr, "llama_peer: unknown flag %s\n", flag);
      exit(2);
    }
  }
  g_verbose = o->verbose;
}

// Loads the CPU backend variants that sit beside libllama (ggml picks the best one for this
// CPU) and returns that directory.
static void LoadBackends(void) {
  Dl_info info;
  if (dladdr((void*)&llama_backend_init, &info) == 0 || info.dli_fname == NULL) {
    Die("cannot find where libllama was loaded from");
  }
  char* path = strdup(info.dli_fname);
  ggml_backend_load_all_from_path(dirname(path));
  free(path);
  if (ggml_backend_reg_by_name("CPU") == NULL) Die("no CPU backend was loaded");
  llama_backend_init();
}

typedef struct {
  struct ggml_threadpool* pool;
  ThreadpoolFreeFn free_fn;
} Threadpool;

static Threadpool AttachThreadpool(struct llama_context* ctx, int threads) {
  ggml_backend_reg_t cpu = ggml_backend_reg_by_name("CPU");
  ThreadpoolNewFn new_fn =
      (ThreadpoolNewFn)ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_new");
  ThreadpoolFreeFn free_fn =
      (ThreadpoolFreeFn)ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_free");
  if (new_fn == NULL || free_fn == NULL) Die("the CPU backend has no ggml_threadpool_new");
  struct ggml_threadpool_params params = ggml_threadpool_params_default(threads);
  struct ggml_threadpool* pool = new_fn(&params);
  if (pool == NULL) Die("ggml_threadpool_new failed");
  llama_attach_threadpool(ctx, pool, pool);
  return (Threadpool){pool, free_fn};
}

static struct llama_model* LoadModel(const char* path) {
  if (path == NULL) Die("--model is required");
  struct llama_model_params params = llama_model_default_params();
  params.n_gpu_layers = 0;
  struct llama_model* model = llama_model_load_from_file(path, params);
  if (model == NULL) {
    fprintf(stderr, "llama_peer: cannot load %s\n", path);
    exit(1);
  }
  return model;
}

static struct llama_context* NewContext(struct llama_model* model, const Options* o, int seq_max,
                                        int seq_tokens, int batch_tokens) {
  struct llama_context_params params = llama_context_default_params();
  params.n_seq_max = (uint32_t)seq_max;
  params.kv_unified = o->kv_unified;
  // Without a unified cache each sequence gets n_ctx / n_seq_max cells of its own and attends
  // over those only; with one, every sequence's tokens attend over all cells in use, masked.
  params.n_ctx = (uint32_t)(seq_max * seq_tokens);
  params.n_batch = (uint32_t)(batch_tokens > 512 ? batch_tokens : 512);
  params.n_ubatch = params.n_batch;
  params.n_threads = o->threads;
  params.n_threads_batch = o->threads;
  params.flash_attn_type = o->flash_attn;
  params.no_perf = true;
  struct llama_context* ctx = llama_init_from_model(model, params);
  if (ctx == NULL) Die("llama_init_from_model failed");
  return ctx;
}

static void BatchAdd(struct llama_batch* batch, llama_token token, llama_pos pos, llama_seq_id seq,
                     bool logits) {
  const int i = batch->n_tokens++;
  batch->token[i] = token;
  batch->pos[i] = pos;
  batch->n_seq_id[i] = 1;
  batch->seq_id[i][0] = seq;
  batch->logits[i] = logits;
}

static void Decode(struct llama_context* ctx, struct llama_batch batch) {
  const int32_t rc = llama_decode(ctx, batch);
  if (rc != 0) {
    fprintf(stderr, "llama_peer: llama_decode returned %d\n", rc);
    exit(1);
  }
  llama_synchronize(ctx);
}

static int Bench(const Options* o) {
  LoadBackends();
  struct llama_model* model = LoadModel(o->model);
  const struct llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  int max_batch = 1;
  for (int i = 0; i < o->num_batches; ++i) {
    if (o->batches[i] > max_batch) max_batch = o->batches[i];
  }
  int seq_tokens = o->context + kUntimedSteps + o->steps;
  if (o->prefill_tokens > seq_tokens) seq_tokens = o->prefill_tokens;
  seq_tokens = (seq_tokens + 255) / 256 * 256;
  int batch_tokens = max_batch * o->context;
  if (o->prefill_tokens > batch_tokens) batch_tokens = o->prefill_tokens;
  struct llama_context* ctx = NewContext(model, o, max_batch, seq_tokens, batch_tokens);
  Threadpool pool = AttachThreadpool(ctx, o->threads);
  llama_memory_t memory = llama_get_memory(ctx);

  char desc[256];
  llama_model_desc(model, desc, sizeof desc);
  const char* label = o->label != NULL ? o->label : desc;
  printf(
      "{\"kind\":\"info\",\"engine\":\"llama.cpp\",\"label\":\"%s\",\"model\":\"%s\","
      "\"desc\":\"%s\",\"size_bytes\":%llu,\"params\":%llu,\"threads\":%d,\"kv_unified\":%s,"
      "\"flash_attn\":\"%s\",\"system\":\"%s\"}\n",
      label, o->model, desc, (unsigned long long)llama_model_size(model),
      (unsigned long long)llama_model_n_params(model), o->threads, o->kv_unified ? "true" : "false",
      llama_flash_attn_type_name(o->flash_attn), llama_print_system_info());
  fflush(stdout);

  uint64_t rng = o->seed * 0x9e3779b97f4a7c15ull + 1;
  struct llama_batch batch = llama_batch_init(batch_tokens, 0, 1);
  llama_token* next = calloc((size_t)max_batch, sizeof(llama_token));
  double* times = calloc((size_t)(o->steps + o->prefill_reps), sizeof(double));
  double decode_tps[kMaxBatches];

  for (int b = 0; b < o->num_batches; ++b) {
    const int n = o->batches[b];
    llama_memory_clear(memory, true);
    batch.n_tokens = 0;
    for (int s = 0; s < n; ++s) {
      for (int i = 0; i < o->context; ++i) {
        const llama_token t = (llama_token)(3 + XorShift(&rng) % (uint64_t)(n_vocab - 3));
        BatchAdd(&batch, t, i, s, i == o->context - 1);
      }
    }
    Decode(ctx, batch);
    for (int s = 0; s < n; ++s) {
      next[s] = Argmax(llama_get_logits_ith(ctx, (s + 1) * o->context - 1), n_vocab);
    }
    double total = 0;
    for (int step = 0; step < kUntimedSteps + o->steps; ++step) {
      batch.n_tokens = 0;
      for (int s = 0; s < n; ++s) BatchAdd(&batch, next[s], o->context + step, s, true);
      const double start = Now();
      Decode(ctx, batch);
      const double seconds = Now() - start;
      if (step >= kUntimedSteps) {
        times[step - kUntimedSteps] = seconds;
        total += seconds;
      }
      for (int s = 0; s < n; ++s) next[s] = Argmax(llama_get_logits_ith(ctx, s), n_vocab);
    }
    const double median = Median(times, o->steps);
    decode_tps[b] = n / median;
    printf(
        "{\"kind\":\"decode\",\"engine\":\"llama.cpp\",\"label\":\"%s\",\"batch\":%d,"
        "\"context\":%d,\"steps\":%d,\"step_ms_median\":%.3f,\"tokens_per_s\":%.2f,"
        "\"tokens_per_s_mean\":%.2f}\n",
        label, n, o->context, o->steps, median * 1e3, decode_tps[b], n * o->steps / total);
    fflush(stdout);
  }

  double prefill_median = 0;
  if (o->prefill_tokens > 0) {
    for (int rep = 0; rep < o->prefill_reps; ++rep) {
      llama_memory_clear(memory, true);
      batch.n_tokens = 0;
      for (int i = 0; i < o->prefill_tokens; ++i) {
        const llama_token t = (llama_token)(3 + XorShift(&rng) % (uint64_t)(n_vocab - 3));
        BatchAdd(&batch, t, i, 0, i == o->prefill_tokens - 1);
      }
      const double start = Now();
      Decode(ctx, batch);
      times[rep] = Now() - start;
    }
    prefill_median = Median(times, o->prefill_reps);
    printf(
        "{\"kind\":\"prefill\",\"engine\":\"llama.cpp\",\"label\":\"%s\",\"tokens\":%d,"
        "\"reps\":%d,\"ms_median\":%.2f,\"ms_best\":%.2f,\"tokens_per_s\":%.2f,"
        "\"tokens_per_s_best\":%.2f}\n",
        label, o->prefill_tokens, o->prefill_reps, prefill_median * 1e3, times[0] * 1e3,
        o->prefill_tokens / prefill_median, o->prefill_tokens / times[0]);
  }

  printf("\nllama.cpp %s (%s, %.2f GB), %d threads\n\n| decode batch |", label, desc,
         llama_model_size(model) / 1e9, o->threads);
  printf(" step (ms, median of %d) | tokens/s |\n|---|---|---|\n", o->steps);
  for (int b = 0; b < o->num_batches; ++b) {
    printf("| %d | %.2f | %.1f |\n", o->batches[b], o->batches[b] / decode_tps[b] * 1e3,
           decode_tps[b]);
  }
  if (o->prefill_tokens > 0) {
    printf("\n| prefill (%d tokens) | ms (median of %d) | tokens/s |\n|---|---|---|\n",
           o->prefill_tokens, o->prefill_reps);
    printf("| %s | %.1f | %.0f |\n", label, prefill_median * 1e3,
           o->prefill_tokens / prefill_median);
  }

  free(times);
  free(next);
  llama_batch_free(batch);
  llama_free(ctx);
  pool.free_fn(pool.pool);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}

static int Generate(const Options* o) {
  if (o->prompt == NULL) Die("--prompt is required");
  LoadBackends();
  struct llama_model* model = LoadModel(o->model);
  const struct llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const int prompt_len = (int)strlen(o->prompt);
  llama_token* tokens = calloc((size_t)(prompt_len + 2 + o->max_tokens), sizeof(llama_token));
  // add_special: BOS first, as the GGUF's tokenizer.ggml.add_bos_token says.
  const int n_prompt =
      llama_tokenize(vocab, o->prompt, prompt_len, tokens, prompt_len + 2, true, false);
  if (n_prompt <= 0) Die("llama_tokenize failed");
  struct llama_context* ctx = NewContext(model, o, 1, n_prompt + o->max_tokens, n_prompt);
  Threadpool pool = AttachThreadpool(ctx, o->threads);

  struct llama_batch batch = llama_batch_init(n_prompt, 0, 1);
  for (int i = 0; i < n_prompt; ++i) BatchAdd(&batch, tokens[i], i, 0, i == n_prompt - 1);
  Decode(ctx, batch);
  int n = n_prompt;
  const llama_token eos = llama_vocab_eos(vocab);
  while (n < n_prompt + o->max_tokens) {
    const llama_token t = Argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    tokens[n++] = t;
    if (t == eos) break;
    batch.n_tokens = 0;
    BatchAdd(&batch, t, n - 1, 0, true);
    Decode(ctx, batch);
  }

  printf("{\"kind\":\"generate\",\"prompt_ids\":[");
  for (int i = 0; i < n_prompt; ++i) printf("%s%d", i ? "," : "", tokens[i]);
  printf("],\"ids\":[");
  for (int i = n_prompt; i < n; ++i) printf("%s%d", i > n_prompt ? "," : "", tokens[i]);
  printf("]}\n");
  for (int i = n_prompt; i < n; ++i) {
    char piece[256];
    const int len = llama_token_to_piece(vocab, tokens[i], piece, sizeof piece, 0, false);
    if (len > 0) fwrite(piece, 1, (size_t)len, stdout);
  }
  printf("\n");

  llama_batch_free(batch);
  free(tokens);
  llama_free(ctx);
  pool.free_fn(pool.pool);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}

static int Quantize(const char* in, const char* out, const char* type, int threads) {
  struct {
    const char* name;
    enum llama_ftype ftype;
  } const kTypes[] = {{"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
                      {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
                      {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M},
                      {"BF16", LLAMA_FTYPE_MOSTLY_BF16}};
  llama_model_quantize_params params = llama_model_quantize_default_params();
  bool found = false;
  for (size_t i = 0; i < sizeof kTypes / sizeof kTypes[0]; ++i) {
    if (strcmp(type, kTypes[i].name) == 0) {
      params.ftype = kTypes[i].ftype;
      found = true;
    }
  }
  if (!found) Die("quantize TYPE is Q8_0, Q4_0, Q4_K_M or BF16");
  params.nthread = threads;
  LoadBackends();
  const double start = Now();
  const uint32_t rc = llama_model_quantize(in, out, &params);
  if (rc != 0) {
    fprintf(stderr, "llama_peer: llama_model_quantize returned %u\n", rc);
    return 1;
  }
  printf("{\"kind\":\"quantize\",\"in\":\"%s\",\"out\":\"%s\",\"type\":\"%s\",\"s\":%.1f}\n", in,
         out, type, Now() - start);
  llama_backend_free();
  return 0;
}

static void Usage(void) {
  fprintf(stderr,
          "usage: llama_peer bench --model M.gguf [--threads 2] [--batches 1,4,16,64]\n"
          "                        [--context 8] [--steps 16] [--prefill_tokens 128]\n"
          "                        [--prefill_reps 3] [--seed 1] [--label NAME]\n"
          "                        [--flash_attn auto|on|off] [--kv_unified 0|1] [--verbose]\n"
          "       llama_peer quantize IN.gguf OUT.gguf Q8_0|Q4_0|Q4_K_M|BF16 [--threads 2]\n"
          "       llama_peer generate --model M.gguf --prompt TEXT [--max_tokens 16]\n");
}

int main(int argc, char** argv) {
  Options o = {
      .threads = 2,
      .batches = {1, 4, 16, 64},
      .num_batches = 4,
      .context = 8,
      .steps = 16,
      .prefill_tokens = 128,
      .prefill_reps = 3,
      .max_tokens = 16,
      .seed = 1,
      .flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO,
      .kv_unified = false,
  };
  llama_log_set(Log, NULL);
  if (argc < 2) {
    Usage();
    return 2;
  }
  const char* mode = argv[1];
  if (strcmp(mode, "bench") == 0) {
    ParseFlags(argc - 2, argv + 2, &o);
    return Bench(&o);
  }
  if (strcmp(mode, "generate") == 0) {
    ParseFlags(argc - 2, argv + 2, &o);
    return Generate(&o);
  }
  if (strcmp(mode, "quantize") == 0) {
    if (argc < 5) {
      Usage();
      return 2;
    }
    ParseFlags(argc - 5, argv + 5, &o);
    return Quantize(argv[2], argv[3], argv[4], o.threads);
  }
  Usage();
  return 2;
}
