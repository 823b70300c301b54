/* A replica's chrome-trace events in C: rollflow.sim._trace.
 *
 * The same text as report.py's Python writer (the reference), event for event: a run has
 * hundreds of thousands of batch records, and formatting them in Python was a fifth of a
 * one-second simulation. printf's "%.3f" is no faster than Python's, so the numbers are written
 * by hand: integers digit by digit, and a fixed-point number as its integer part and its
 * rounded fraction, which equals the correctly rounded "%.Nf" (Python's and glibc's) unless the
 * fraction lies within 1e-6 of a rounding tie, where snprintf decides. Tests compare the two
 * writers byte for byte, ties and odd values included.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char *text;
    Py_ssize_t size, capacity;
} Buffer;

static int reserve(Buffer *b, Py_ssize_t more) {
    if (b->size + more <= b->capacity) return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 1 << 16;
    while (capacity < b->size + more) capacity *= 2;
    char *text = PyMem_Realloc(b->text, capacity);
    if (text == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->text = text;
    b->capacity = capacity;
    return 0;
}

/* The numbers of one record: `width` items, floats where `is_float` says, ints elsewhere. */
static int read_row(PyObject *row, Py_ssize_t width, const int *is_float, double *floats, long long *ints) {
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != width) {
        PyErr_Format(PyExc_TypeError, "a record must be a tuple of %zd numbers", width);
        return -1;
    }
    for (Py_ssize_t i = 0; i < width; i++) {
        PyObject *item = PyTuple_GET_ITEM(row, i);
        if (is_float[i]) {
            floats[i] = PyFloat_AsDouble(item);
            if (floats[i] == -1.0 && PyErr_Occurred()) return -1;
        } else {
            ints[i] = PyLong_AsLongLong(item);
            if (ints[i] == -1 && PyErr_Occurred()) return -1;
        }
    }
    return 0;
}

/* report._batch_name's kind */
static const char *batch_kind(long long tokens, long long prefill_tokens) {
    return prefill_tokens == tokens ? "prefill" : prefill_tokens == 0 ? "decode" : "mixed";
}

/* Appending to a buffer with room reserved beforehand (an event is under 512 bytes). */
static char *put_text(char *at, const char *text) {
    size_t n = strlen(text);
    memcpy(at, text, n);
    return at + n;
}

static char *put_int(char *at, long long value) {
    char digits[24];
    int n = 0;
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        digits[n++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0) *at++ = '-';
    while (n) *at++ = digits[--n];
    return at;
}

/* "%.{places}f" % value, places 2 or 3. */
static char *put_fixed(char *at, double value, int places) {
    const double scale = places == 3 ? 1000.0 : 100.0;
    if (!signbit(value) && value < 1e12) { /* -0.0 is "-0.000": snprintf */
        double whole = floor(value);
        double scaled = (value - whole) * scale; /* the fraction is exact; its product off by ~1e-13 */
        double tie = floor(scaled) + 0.5;
        if (fabs(scaled - tie) > 1e-6) {
            long long units = (long long)whole, fraction = (long long)floor(scaled + 0.5);
            if (fraction == (long long)scale) {
                units += 1;
                fraction = 0;
            }
            at = put_int(at, units);
            *at++ = '.';
            for (long long divisor = (long long)scale / 10; divisor; divisor /= 10) {
                *at++ = (char)('0' + fraction / divisor);
                fraction %= divisor;
            }
            return at;
        }
    }
    return at + snprintf(at, 400, "%.*f", places, value); /* ties, negatives, huge, inf and nan */
}

static PyObject *replica_events(PyObject *module, PyObject *args) {
    PyObject *batches, *kv_samples;
    long long pid;
    if (!PyArg_ParseTuple(args, "LO!O!", &pid, &PyList_Type, &batches, &PyList_Type, &kv_samples)) return NULL;
    Buffer b = {NULL, 0, 0};
    static const int batch_floats[6] = {1, 1, 0, 0, 0, 0}, load_floats[4] = {1, 1, 0, 0};
    double f[6];
    long long n[6];
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(batches); r++) {
        /* (scheduled_at, duration, size, tokens per iteration, prefill tokens, iterations) */
        if (read_row(PyList_GET_ITEM(batches, r), 6, batch_floats, f, n) < 0 || reserve(&b, 1024) < 0) goto fail;
        char *at = b.text + b.size;
        at = put_text(at, ",\n{\"name\": \"");
        at = put_text(at, batch_kind(n[3], n[4]));
        if (n[5] > 1) {
            at = put_text(at, " x");
            at = put_int(at, n[5]);
        }
        at = put_text(at, "\", \"ph\": \"X\", \"pid\": ");
        at = put_int(at, pid);
        at = put_text(at, ", \"tid\": 0, \"ts\": ");
        at = put_fixed(at, f[0] * 1e6, 3);
        at = put_text(at, ", \"dur\": ");
        at = put_fixed(at, f[1] * 1e6, 3);
        at = put_text(at, ", \"args\": {\"batch_size\": ");
        at = put_int(at, n[2]);
        at = put_text(at, ", \"tokens_per_iteration\": ");
        at = put_int(at, n[3]);
        at = put_text(at, ", \"prefill_tokens\": ");
        at = put_int(at, n[4]);
        at = put_text(at, ", \"iterations\": ");
        at = put_int(at, n[5]);
        at = put_text(at, "}}");
        b.size = at - b.text;
    }
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(kv_samples); r++) {
        /* (time, kv used fraction, waiting requests, resident requests) */
        if (read_row(PyList_GET_ITEM(kv_samples, r), 4, load_floats, f, n) < 0 || reserve(&b, 1024) < 0) goto fail;
        char *at = b.text + b.size;
        at = put_text(at, ",\n{\"name\": \"load\", \"ph\": \"C\", \"pid\": ");
        at = put_int(at, pid);
        at = put_text(at, ", \"ts\": ");
        at = put_fixed(at, f[0] * 1e6, 3);
        at = put_text(at, ", \"args\": {\"kv_use_pct\": ");
        at = put_fixed(at, 100 * f[1], 2);
        at = put_text(at, ", \"waiting\": ");
        at = put_int(at, n[2]);
        at = put_text(at, ", \"resident\": ");
        at = put_int(at, n[3]);
        at = put_text(at, "}}");
        b.size = at - b.text;
    }
    PyObject *text = PyUnicode_DecodeASCII(b.text ? b.text : "", b.size, "strict");
    PyMem_Free(b.text);
    return text;
fail:
    PyMem_Free(b.text);
    return NULL;
}

/* For tests: "%.{places}f" % value through the fast path. */
static PyObject *format_fixed(PyObject *module, PyObject *args) {
    double value;
    int places;
    if (!PyArg_ParseTuple(args, "di", &value, &places)) return NULL;
    if (places != 2 && places != 3) {
        PyErr_SetString(PyExc_ValueError, "places must be 2 or 3");
        return NULL;
    }
    char text[512];
    char *end = put_fixed(text, value, places);
    return PyUnicode_DecodeASCII(text, end - text, "strict");
}

static PyMethodDef trace_methods[] = {
    {"replica_events", replica_events, METH_VARARGS,
     "replica_events(pid, batches, kv_samples) -> str: a replica's batch slices and load counters, each "
     "preceded by ',\\n', as rollflow.sim.report writes them"},
    {"format_fixed", format_fixed, METH_VARARGS, "format_fixed(value, places) -> '%.{places}f' % value"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef trace_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rollflow.sim._trace",
    .m_doc = "Chrome-trace event text in C (rollflow.sim.report's Python writer is the reference).",
    .m_size = -1,
    .m_methods = trace_methods,
};

PyMODINIT_FUNC PyInit__trace(void) { return PyModule_Create(&trace_module); }
