/* The compiled execution-time model as other C extensions call it.
 *
 * rollflow.perf._timing exports these through a capsule (ROLLFLOW_TIMING_CAPSULE), so the
 * simulator's compiled loop (rollflow/sim/_loop.c) times batches with the very functions the
 * predictor's Python-facing methods wrap: one implementation of the arithmetic, not two.
 */
#ifndef ROLLFLOW_TIMING_API_H
#define ROLLFLOW_TIMING_API_H

#include <Python.h>

#define ROLLFLOW_TIMING_CAPSULE "rollflow.perf._timing._C_API"

/* One prefill of a batch: (tokens already cached, chunk size). */
typedef struct {
    long long cached, chunk;
} Prefill;

/* Consecutive iterations of equal time: (iterations, seconds each). */
typedef struct {
    long long count;
    double seconds;
} Piece;

typedef struct {
    Piece *items;
    Py_ssize_t size, capacity;
} PieceVec;

typedef struct {
    PyTypeObject *timer_type; /* StageTimer: the `timer` argument of the functions below */
    /* Each returns 0, or -1 with a Python exception set. */
    int (*stage_seconds)(PyObject *timer, long long num_tokens, long long decode_batch_size,
                         long long decode_kv_sum, const Prefill *prefills, Py_ssize_t num_prefills,
                         int is_last_stage, double *out);
    /* decode_run's and chunk_run's pieces, replacing the contents of `out` (grown as needed) */
    int (*decode_run)(PyObject *timer, long long batch_size, long long decode_kv_sum,
                      long long num_iterations, PieceVec *out);
    int (*chunk_run)(PyObject *timer, long long decode_batch_size, long long decode_kv_sum,
                     long long cached, long long chunk, long long num_iterations, PieceVec *out);
} TimingAPI;

#endif
