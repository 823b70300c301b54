/* The execution-time model's lookups in C: rollflow.perf._timing.StageTimer.
 *
 * The same arithmetic as ExecutionTimePredictor's Python methods (stage_seconds, decode_run,
 * chunk_run) and PrefillGrid.lookup, operation for operation, so both give bit-identical
 * seconds: Python evaluates float expressions left to right without fused multiply-adds, and
 * this file is compiled with -ffp-contract=off so that C does too. The prefill grid's
 * interpolation is numpy.interp's (x between two sampled points: slope * (x - xp[j]) + fp[j];
 * at or past the ends: the end values) on strictly increasing sample points, which the Python
 * side checks before it uses this module. The Python methods stay the reference; tests compare
 * the two.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#include "_timing_api.h"

typedef struct {
    double *values;
    Py_ssize_t size;
} Vector;

typedef struct {
    PyObject_HEAD
    Vector linear;     /* [num_tokens] linear operators, ms per layer */
    Vector kv_save;    /* [num_tokens] KV-cache writes, ms per layer */
    Vector send_recv;  /* [num_tokens] activations to the next stage, ms per stage */
    Vector *decode;    /* [decode batch size][kv bucket] decode attention, ms per layer */
    Py_ssize_t num_decode_rows;
    Vector chunk_sizes;  /* sampled prefill chunk sizes, ascending */
    Vector *kv_points;   /* per chunk size: cached-prefix lengths, strictly ascending */
    Vector *prefill_ms;  /* per chunk size: prefill attention time at each prefix length */
    Py_ssize_t num_kv_points, num_prefill_rows;
    long long granularity;
    double decode_overhead;
    double prefill_overhead;
    long long num_layers;
} StageTimer;

static long long floor_div(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static long long ceil_div(long long a, long long b) { return -floor_div(-a, b); }

static int read_vector(PyObject *sequence, Vector *out, const char *name) {
    PyObject *fast = PySequence_Fast(sequence, name);
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    out->values = PyMem_Malloc(sizeof(double) * (n > 0 ? n : 1));
    out->size = n;
    if (out->values == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        out->values[i] = PyFloat_AsDouble(items[i]);
        if (out->values[i] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static int read_vectors(PyObject *sequence, Vector **out, Py_ssize_t *count, const char *name) {
    PyObject *fast = PySequence_Fast(sequence, name);
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    *out = PyMem_Calloc(n > 0 ? n : 1, sizeof(Vector));
    *count = n;
    if (*out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (read_vector(PySequence_Fast_GET_ITEM(fast, i), &(*out)[i], name) < 0) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static void free_vectors(Vector *vectors, Py_ssize_t count) {
    if (vectors == NULL) return;
    for (Py_ssize_t i = 0; i < count; i++) PyMem_Free(vectors[i].values);
    PyMem_Free(vectors);
}

static void StageTimer_dealloc(StageTimer *self) {
    PyMem_Free(self->linear.values);
    PyMem_Free(self->kv_save.values);
    PyMem_Free(self->send_recv.values);
    free_vectors(self->decode, self->num_decode_rows);
    free_vectors(self->kv_points, self->num_kv_points);
    free_vectors(self->prefill_ms, self->num_prefill_rows);
    PyMem_Free(self->chunk_sizes.values);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int StageTimer_init(StageTimer *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"linear_ms", "kv_save_ms", "send_recv_ms", "decode_ms", "chunk_sizes",
                               "kv_points", "prefill_ms", "kv_granularity", "decode_overhead",
                               "prefill_overhead", "num_layers", NULL};
    PyObject *linear, *kv_save, *send_recv, *decode, *chunk_sizes, *kv_points, *prefill_ms;
    if (self->linear.values != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StageTimer is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOLddL", keywords, &linear, &kv_save,
                                     &send_recv, &decode, &chunk_sizes, &kv_points, &prefill_ms,
                                     &self->granularity, &self->decode_overhead,
                                     &self->prefill_overhead, &self->num_layers))
        return -1;
    if (self->granularity < 1) {
        PyErr_SetString(PyExc_ValueError, "kv_granularity must be at least 1");
        return -1;
    }
    if (read_vector(linear, &self->linear, "linear_ms") < 0 ||
        read_vector(kv_save, &self->kv_save, "kv_save_ms") < 0 ||
        read_vector(send_recv, &self->send_recv, "send_recv_ms") < 0 ||
        read_vectors(decode, &self->decode, &self->num_decode_rows, "decode_ms") < 0 ||
        read_vector(chunk_sizes, &self->chunk_sizes, "chunk_sizes") < 0 ||
        read_vectors(kv_points, &self->kv_points, &self->num_kv_points, "kv_points") < 0 ||
        read_vectors(prefill_ms, &self->prefill_ms, &self->num_prefill_rows, "prefill_ms") < 0)
        return -1;
    if (self->linear.size == 0 || self->num_decode_rows == 0 || self->chunk_sizes.size == 0) {
        PyErr_SetString(PyExc_ValueError, "empty operator grid");
        return -1;
    }
    if (self->num_kv_points != self->chunk_sizes.size || self->num_prefill_rows != self->chunk_sizes.size) {
        PyErr_SetString(PyExc_ValueError, "kv_points and prefill_ms need one row per chunk size");
        return -1;
    }
    for (Py_ssize_t c = 0; c < self->num_kv_points; c++) {
        Vector xp = self->kv_points[c];
        if (xp.size == 0 || xp.size != self->prefill_ms[c].size) {
            PyErr_SetString(PyExc_ValueError, "a chunk size's kv_points and prefill_ms differ in length");
            return -1;
        }
        for (Py_ssize_t i = 1; i < xp.size; i++) {
            if (!(xp.values[i - 1] < xp.values[i])) {
                PyErr_SetString(PyExc_ValueError, "kv_points must be strictly increasing");
                return -1;
            }
        }
    }
    return 0;
}

/* numpy.interp(x, xp, fp) for one x and strictly increasing xp. */
static double interp(double x, const Vector *xp, const Vector *fp) {
    Py_ssize_t n = xp->size;
    const double *dx = xp->values, *dy = fp->values;
    if (n == 1) return dy[0];
    if (x < dx[0]) return dy[0];
    if (x > dx[n - 1]) return dy[n - 1];
    Py_ssize_t lo = 0, hi = n; /* the last j with dx[j] <= x */
    while (lo < hi) {
        Py_ssize_t mid = lo + ((hi - lo) >> 1);
        if (x >= dx[mid])
            lo = mid + 1;
        else
            hi = mid;
    }
    Py_ssize_t j = lo - 1;
    if (j == n - 1 || dx[j] == x) return dy[j];
    double slope = (dy[j + 1] - dy[j]) / (dx[j + 1] - dx[j]);
    double value = slope * (x - dx[j]) + dy[j];
    if (isnan(value)) {
        value = slope * (x - dx[j + 1]) + dy[j + 1];
        if (isnan(value) && dy[j] == dy[j + 1]) value = dy[j];
    }
    return value;
}

/* PrefillGrid.lookup: along the prefix within a sampled chunk size, in chunk**2 between two. */
static double prefill_lookup(const StageTimer *self, long long kv_cache_size, long long chunk_size) {
    const double *sizes = self->chunk_sizes.values;
    Py_ssize_t n = self->chunk_sizes.size, hi = 0;
    double chunk = (double)chunk_size, kv = (double)kv_cache_size;
    while (hi < n && sizes[hi] < chunk) hi++; /* numpy.searchsorted, side="left" */
    if (hi == 0 || hi == n) {
        Py_ssize_t idx = hi == 0 ? 0 : n - 1;
        return interp(kv, &self->kv_points[idx], &self->prefill_ms[idx]);
    }
    Py_ssize_t lo = hi - 1;
    double c0 = sizes[lo], c1 = sizes[hi];
    double weight = ((double)(chunk_size * chunk_size) - c0 * c0) / (c1 * c1 - c0 * c0);
    return (1 - weight) * interp(kv, &self->kv_points[lo], &self->prefill_ms[lo]) +
           weight * interp(kv, &self->kv_points[hi], &self->prefill_ms[hi]);
}

static int token_ms(const StageTimer *self, long long num_tokens, double *out) {
    Py_ssize_t last = self->linear.size - 1;
    long long rounded = floor_div(num_tokens + 7, 8) * 8;
    if (num_tokens < 0) goto out_of_range;
    if (rounded > last) {
        long long k = num_tokens < last ? num_tokens : last;
        if (k >= self->kv_save.size) goto out_of_range;
        *out = self->linear.values[last] + self->kv_save.values[k];
        return 0;
    }
    if (num_tokens >= self->kv_save.size) goto out_of_range;
    *out = self->linear.values[rounded] + self->kv_save.values[num_tokens];
    return 0;
out_of_range:
    PyErr_Format(PyExc_IndexError, "num_tokens %lld outside the operator grid", num_tokens);
    return -1;
}

static int decode_ms(const StageTimer *self, long long batch_size, long long mean_kv, double *out) {
    if (batch_size < 0 || batch_size >= self->num_decode_rows) {
        PyErr_Format(PyExc_IndexError, "decode batch size %lld outside the operator grid", batch_size);
        return -1;
    }
    const Vector *row = &self->decode[batch_size];
    long long bucket = ceil_div(mean_kv, self->granularity);
    if (bucket < 0 || row->size == 0) {
        PyErr_Format(PyExc_IndexError, "kv length %lld outside the operator grid", mean_kv);
        return -1;
    }
    double value = bucket < row->size ? row->values[bucket] : row->values[row->size - 1];
    *out = batch_size > 1 ? value * (1.0 + self->decode_overhead) : value;
    return 0;
}

static int stage_seconds(const StageTimer *self, long long num_tokens, long long decode_batch_size,
                         long long decode_kv_sum, const Prefill *prefills, Py_ssize_t num_prefills,
                         int is_last_stage, double *out) {
    double layer_ms, value;
    if (token_ms(self, num_tokens, &layer_ms) < 0) return -1;
    if (decode_batch_size) {
        if (decode_ms(self, decode_batch_size, floor_div(decode_kv_sum, decode_batch_size), &value) < 0)
            return -1;
        layer_ms += value;
    }
    if (num_prefills == 1) {
        long long g = self->granularity;
        layer_ms += prefill_lookup(self, ceil_div(prefills[0].cached, g) * g, prefills[0].chunk);
    } else if (num_prefills > 1) {
        long long g = self->granularity, kv_sum = 0, squares = 0;
        for (Py_ssize_t i = 0; i < num_prefills; i++) {
            kv_sum += ceil_div(prefills[i].cached, g) * g;
            squares += prefills[i].chunk * prefills[i].chunk;
        }
        value = prefill_lookup(self, kv_sum, (long long)nearbyint(sqrt((double)squares)));
        layer_ms += value * (1.0 + self->prefill_overhead);
    }
    double stage_ms = (double)self->num_layers * layer_ms;
    if (!is_last_stage) {
        long long k = floor_div(num_tokens + 7, 8) * 8, last = self->send_recv.size - 1;
        stage_ms += self->send_recv.values[k < last ? k : last];
    }
    *out = stage_ms * 1e-3;
    return 0;
}

static PyObject *StageTimer_stage_seconds(StageTimer *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"num_tokens", "decode_batch_size", "decode_kv_sum", "prefills",
                               "is_last_stage", NULL};
    long long num_tokens, decode_batch_size, decode_kv_sum;
    PyObject *prefills_arg;
    int is_last_stage = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLLO|p", keywords, &num_tokens, &decode_batch_size,
                                     &decode_kv_sum, &prefills_arg, &is_last_stage))
        return NULL;
    PyObject *fast = PySequence_Fast(prefills_arg, "prefills must be a sequence of (cached, chunk)");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Prefill small[8];
    Prefill *prefills = n <= 8 ? small : PyMem_Malloc(sizeof(Prefill) * n);
    if (prefills == NULL) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "LL;a prefill is (cached, chunk)",
                              &prefills[i].cached, &prefills[i].chunk))
            goto done;
    }
    double seconds;
    if (stage_seconds(self, num_tokens, decode_batch_size, decode_kv_sum, prefills, n, is_last_stage,
                      &seconds) == 0)
        result = PyFloat_FromDouble(seconds);
done:
    if (prefills != small) PyMem_Free(prefills);
    Py_DECREF(fast);
    return result;
}

static int push_piece(PieceVec *out, long long count, double seconds) {
    if (out->size == out->capacity) {
        Py_ssize_t capacity = out->capacity ? 2 * out->capacity : 8;
        Piece *items = PyMem_Realloc(out->items, sizeof(Piece) * capacity);
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        out->items = items;
        out->capacity = capacity;
    }
    out->items[out->size++] = (Piece){count, seconds};
    return 0;
}

static int decode_run(const StageTimer *self, long long batch_size, long long decode_kv_sum,
                      long long num_iterations, PieceVec *out) {
    out->size = 0;
    if (batch_size < 1) {
        PyErr_SetString(PyExc_ValueError, "a decode run needs a batch");
        return -1;
    }
    double base_ms, attention_ms;
    if (token_ms(self, batch_size, &base_ms) < 0) return -1;
    long long g = self->granularity, mean_kv = floor_div(decode_kv_sum, batch_size);
    long long remaining = num_iterations;
    while (remaining > 0) {
        long long bucket = ceil_div(mean_kv, g);
        long long count = bucket * g - mean_kv + 1;
        if (count > remaining) count = remaining;
        if (decode_ms(self, batch_size, mean_kv, &attention_ms) < 0) return -1;
        double seconds = (double)self->num_layers * (base_ms + attention_ms) * 1e-3;
        if (push_piece(out, count, seconds) < 0) return -1;
        mean_kv += count;
        remaining -= count;
    }
    return 0;
}

static int chunk_run(const StageTimer *self, long long decode_batch_size, long long decode_kv_sum,
                     long long cached, long long chunk, long long num_iterations, PieceVec *out) {
    out->size = 0;
    for (long long j = 0; j < num_iterations; j++) {
        Prefill prefill = {cached + j * chunk, chunk};
        double seconds;
        if (stage_seconds(self, decode_batch_size + chunk, decode_batch_size,
                          decode_kv_sum + j * decode_batch_size, &prefill, 1, 1, &seconds) < 0 ||
            push_piece(out, 1, seconds) < 0)
            return -1;
    }
    return 0;
}

/* A run's pieces as Python's [(iterations, seconds each)], freeing the vector. */
static PyObject *pieces_to_list(PieceVec *pieces, int status) {
    PyObject *list = status < 0 ? NULL : PyList_New(pieces->size);
    for (Py_ssize_t i = 0; list != NULL && i < pieces->size; i++) {
        PyObject *piece = Py_BuildValue("(Ld)", pieces->items[i].count, pieces->items[i].seconds);
        if (piece == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, piece);
    }
    PyMem_Free(pieces->items);
    return list;
}

static PyObject *StageTimer_decode_run(StageTimer *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"batch_size", "decode_kv_sum", "num_iterations", NULL};
    long long batch_size, decode_kv_sum, num_iterations;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLL", keywords, &batch_size, &decode_kv_sum,
                                     &num_iterations))
        return NULL;
    PieceVec pieces = {NULL, 0, 0};
    return pieces_to_list(&pieces, decode_run(self, batch_size, decode_kv_sum, num_iterations, &pieces));
}

static PyObject *StageTimer_chunk_run(StageTimer *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"decode_batch_size", "decode_kv_sum", "cached", "chunk", "num_iterations",
                               NULL};
    long long decode_batch_size, decode_kv_sum, cached, chunk, num_iterations;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLLLL", keywords, &decode_batch_size, &decode_kv_sum,
                                     &cached, &chunk, &num_iterations))
        return NULL;
    PieceVec pieces = {NULL, 0, 0};
    return pieces_to_list(
        &pieces, chunk_run(self, decode_batch_size, decode_kv_sum, cached, chunk, num_iterations, &pieces));
}

static PyMethodDef StageTimer_methods[] = {
    {"stage_seconds", (PyCFunction)(void (*)(void))StageTimer_stage_seconds, METH_VARARGS | METH_KEYWORDS,
     "stage_seconds(num_tokens, decode_batch_size, decode_kv_sum, prefills, is_last_stage=True)"},
    {"decode_run", (PyCFunction)(void (*)(void))StageTimer_decode_run, METH_VARARGS | METH_KEYWORDS,
     "decode_run(batch_size, decode_kv_sum, num_iterations) -> [(iterations, seconds each)]"},
    {"chunk_run", (PyCFunction)(void (*)(void))StageTimer_chunk_run, METH_VARARGS | METH_KEYWORDS,
     "chunk_run(decode_batch_size, decode_kv_sum, cached, chunk, num_iterations)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StageTimerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rollflow.perf._timing.StageTimer",
    .tp_doc = PyDoc_STR("ExecutionTimePredictor's lookups over its operator grids, in C."),
    .tp_basicsize = sizeof(StageTimer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)StageTimer_init,
    .tp_dealloc = (destructor)StageTimer_dealloc,
    .tp_methods = StageTimer_methods,
};

/* The capsule's functions: the StageTimer's C functions over a PyObject (see _timing_api.h). */
static int api_stage_seconds(PyObject *timer, long long num_tokens, long long decode_batch_size,
                             long long decode_kv_sum, const Prefill *prefills, Py_ssize_t num_prefills,
                             int is_last_stage, double *out) {
    return stage_seconds((StageTimer *)timer, num_tokens, decode_batch_size, decode_kv_sum, prefills,
                         num_prefills, is_last_stage, out);
}

static int api_decode_run(PyObject *timer, long long batch_size, long long decode_kv_sum,
                          long long num_iterations, PieceVec *out) {
    return decode_run((StageTimer *)timer, batch_size, decode_kv_sum, num_iterations, out);
}

static int api_chunk_run(PyObject *timer, long long decode_batch_size, long long decode_kv_sum,
                         long long cached, long long chunk, long long num_iterations, PieceVec *out) {
    return chunk_run((StageTimer *)timer, decode_batch_size, decode_kv_sum, cached, chunk, num_iterations,
                     out);
}

static TimingAPI timing_api = {&StageTimerType, api_stage_seconds, api_decode_run, api_chunk_run};

static struct PyModuleDef timing_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rollflow.perf._timing",
    .m_doc = "Compiled lookups of the execution-time model (rollflow.perf.predictor is the reference).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__timing(void) {
    if (PyType_Ready(&StageTimerType) < 0) return NULL;
    PyObject *module = PyModule_Create(&timing_module);
    if (module == NULL) return NULL;
    Py_INCREF(&StageTimerType);
    if (PyModule_AddObject(module, "StageTimer", (PyObject *)&StageTimerType) < 0) {
        Py_DECREF(&StageTimerType);
        Py_DECREF(module);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&timing_api, ROLLFLOW_TIMING_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(module, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
