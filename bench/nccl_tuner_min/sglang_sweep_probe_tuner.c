/*
 * sglang-sweep-probe: the smallest NCCL tuner plugin that NCCL will load.
 *
 * It exists to see, on a real NCCL, which lines NCCL prints when NCCL_TUNER_PLUGIN names a library
 * that loads (docs/measurements/h200-tuner-plugin/). init logs nothing and returns success,
 * getCollInfo leaves NCCL's own choice alone (it does not touch the cost table or nChannels), and
 * finalize does nothing. It reads no rule file: NCCL_TUNER_CONFIG_FILE is for ext-tuner/example.
 *
 * No NCCL header is needed: the types below are written out from NCCL's tuner plugin interface
 * (src/include/plugin/tuner/tuner_v5.h and tuner_v4.h in NCCL 2.27+), where every function returns
 * ncclResult_t (an int enum, ncclSuccess == 0), ncclFunc_t is an int enum, and the struct is four
 * pointers: name, init, getCollInfo, finalize (v4 calls the last one destroy).
 *
 * NCCL looks the struct up with dlsym by name, newest interface first: "ncclTunerPlugin_v5"
 * (NCCL 2.27/2.28), then "ncclTunerPlugin_v4", ... It logs `TUNER/Plugin: Using <name> (v<N>)` for
 * the first one it finds. Both are exported here; NCCL 2.28 takes v5.
 *
 * Built with SGLANG_SWEEP_PROBE_NO_SYMBOL defined, the library exports no tuner struct at all:
 * a library that opens but is no tuner.
 */
#include <stddef.h>
#include <stdint.h>

#define PROBE_EXPORT __attribute__((visibility("default")))

typedef int probe_result_t; /* ncclResult_t */
#define PROBE_SUCCESS 0     /* ncclSuccess */
typedef int probe_func_t;   /* ncclFunc_t */
typedef void (*probe_logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

#ifndef SGLANG_SWEEP_PROBE_NO_SYMBOL

static int probe_context; /* a non-NULL context for NCCL to hand back */

/* v5: init(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
 *          ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants) */
static probe_result_t probe_init_v5(void** ctx, uint64_t comm_id, size_t n_ranks, size_t n_nodes, probe_logger_t log,
                                    void* nvl_domain_info, void* constants) {
  (void)comm_id; (void)n_ranks; (void)n_nodes; (void)log; (void)nvl_domain_info; (void)constants;
  *ctx = &probe_context;
  return PROBE_SUCCESS;
}

/* v4: init(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context) */
static probe_result_t probe_init_v4(size_t n_ranks, size_t n_nodes, probe_logger_t log, void** ctx) {
  (void)n_ranks; (void)n_nodes; (void)log;
  *ctx = &probe_context;
  return PROBE_SUCCESS;
}

/* v4 and v5: getCollInfo(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
 *                        float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels)
 * Leaving every output unset keeps NCCL's own choice. */
static probe_result_t probe_get_coll_info(void* ctx, probe_func_t coll_type, size_t n_bytes, int num_pipe_ops,
                                          float** coll_cost_table, int num_algo, int num_proto, int reg_buff,
                                          int* n_channels) {
  (void)ctx; (void)coll_type; (void)n_bytes; (void)num_pipe_ops; (void)coll_cost_table; (void)num_algo;
  (void)num_proto; (void)reg_buff; (void)n_channels;
  return PROBE_SUCCESS;
}

static probe_result_t probe_finalize(void* ctx) {
  (void)ctx;
  return PROBE_SUCCESS;
}

typedef struct {
  const char* name;
  probe_result_t (*init)(void**, uint64_t, size_t, size_t, probe_logger_t, void*, void*);
  probe_result_t (*getCollInfo)(void*, probe_func_t, size_t, int, float**, int, int, int, int*);
  probe_result_t (*finalize)(void*);
} probe_tuner_v5_t;

typedef struct {
  const char* name;
  probe_result_t (*init)(size_t, size_t, probe_logger_t, void**);
  probe_result_t (*getCollInfo)(void*, probe_func_t, size_t, int, float**, int, int, int, int*);
  probe_result_t (*destroy)(void*);
} probe_tuner_v4_t;

PROBE_EXPORT probe_tuner_v5_t ncclTunerPlugin_v5 = {"sglang-sweep-probe", probe_init_v5, probe_get_coll_info,
                                                    probe_finalize};
PROBE_EXPORT probe_tuner_v4_t ncclTunerPlugin_v4 = {"sglang-sweep-probe", probe_init_v4, probe_get_coll_info,
                                                    probe_finalize};

#else

PROBE_EXPORT int sglang_sweep_probe_not_a_tuner = 1; /* the library opens; NCCL finds no tuner in it */

#endif
