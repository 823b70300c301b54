/* An SGLang event's JSON without the output it repeats: the C twin of
 * rollflow/runtime/engines/trim.py's `trim_event_py` (the reference; tests check they agree byte for
 * byte on every input, None included).
 *
 * SGLang's default events each repeat the whole output so far (`output_ids` and
 * `meta_info.output_token_logprobs`), and parsing all of it per read cost the manager time in
 * proportion to the output's length, per token. The manager knows how many tokens it has seen, so
 * it cuts those from the front of both lists here, in one pass over the bytes, and parses the rest.
 *
 * trim_event(data, drop) -> bytes | None
 *   `data` is one event's JSON. When it is an object with the key "output_ids" once, holding a list,
 *   and "meta_info" once, holding an object with "output_token_logprobs" once, holding a list (keys
 *   spelled without escapes), and both lists hold at least `drop` elements, the first `drop` of
 *   which are, in `output_ids`, numbers and, in `output_token_logprobs`, lists of scalars (numbers,
 *   strings, true, false, null), all in printable ASCII: `data` without those elements. Else None
 *   (as for drop <= 0), and the caller parses the event whole. Only the dropped elements are
 *   checked to be JSON; the caller's parse checks the rest.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_DEPTH 512

typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
} Text;

static Py_ssize_t ws(Text t, Py_ssize_t i) {
    while (i < t.n && (t.s[i] == ' ' || t.s[i] == '\t' || t.s[i] == '\n' || t.s[i] == '\r')) i++;
    return i;
}

static int is_hex(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* The end of the string starting at t.s[i] == '"', or -1. `strict`: only printable ASCII and JSON's
 * escapes; else any bytes, a backslash escaping the next one. */
static Py_ssize_t string_end(Text t, Py_ssize_t i, int strict) {
    i++;
    while (i < t.n) {
        unsigned char c = t.s[i];
        if (c == '"') return i + 1;
        if (strict && (c < 0x20 || c >= 0x80)) return -1;
        if (c == '\\') {
            if (i + 1 >= t.n) return -1;
            unsigned char e = t.s[i + 1];
            if (!strict) {
                i += 2;
                continue;
            }
            if (e == 'u') {
                if (i + 5 >= t.n || !is_hex(t.s[i + 2]) || !is_hex(t.s[i + 3]) || !is_hex(t.s[i + 4]) ||
                    !is_hex(t.s[i + 5]))
                    return -1;
                i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return -1;
            i += 2;
            continue;
        }
        i++;
    }
    return -1;
}

/* The end of the JSON number at i, or -1. */
static Py_ssize_t number_end(Text t, Py_ssize_t i) {
    if (i < t.n && t.s[i] == '-') i++;
    if (i >= t.n) return -1;
    if (t.s[i] == '0') {
        i++;
    } else if (t.s[i] >= '1' && t.s[i] <= '9') {
        while (i < t.n && is_digit(t.s[i])) i++;
    } else {
        return -1;
    }
    if (i < t.n && t.s[i] == '.') {
        i++;
        if (i >= t.n || !is_digit(t.s[i])) return -1;
        while (i < t.n && is_digit(t.s[i])) i++;
    }
    if (i < t.n && (t.s[i] == 'e' || t.s[i] == 'E')) {
        i++;
        if (i < t.n && (t.s[i] == '+' || t.s[i] == '-')) i++;
        if (i >= t.n || !is_digit(t.s[i])) return -1;
        while (i < t.n && is_digit(t.s[i])) i++;
    }
    return i;
}

static Py_ssize_t literal_end(Text t, Py_ssize_t i, const char *word) {
    Py_ssize_t len = (Py_ssize_t)strlen(word);
    return (t.n - i >= len && memcmp(t.s + i, word, (size_t)len) == 0) ? i + len : -1;
}

/* The end of the scalar at i (checked), or -1. */
static Py_ssize_t scalar_end(Text t, Py_ssize_t i) {
    if (i >= t.n) return -1;
    switch (t.s[i]) {
    case '"': return string_end(t, i, 1);
    case 't': return literal_end(t, i, "true");
    case 'f': return literal_end(t, i, "false");
    case 'n': return literal_end(t, i, "null");
    default: return number_end(t, i);
    }
}

/* From the element at i to the end of its list, each element's end found by `element_end` and
 * followed by a comma or the closing bracket: the list's end, or -1. */
static Py_ssize_t list_rest(Text t, Py_ssize_t i, Py_ssize_t (*element_end)(Text, Py_ssize_t)) {
    for (;;) {
        i = element_end(t, i);
        if (i < 0) return -1;
        i = ws(t, i);
        if (i >= t.n) return -1;
        if (t.s[i] == ']') return i + 1;
        if (t.s[i] != ',') return -1;
        i = ws(t, i + 1);
    }
}

/* The end of a list of scalars at t.s[i] == '[' (checked), or -1. */
static Py_ssize_t scalar_list_end(Text t, Py_ssize_t i) {
    i = ws(t, i + 1);
    if (i < t.n && t.s[i] == ']') return i + 1;
    return list_rest(t, i, scalar_end);
}

/* The end of any value at i, unchecked but for its brackets and strings, or -1. */
static Py_ssize_t value_end(Text t, Py_ssize_t i) {
    char stack[MAX_DEPTH];
    int depth = 0;
    if (i >= t.n) return -1;
    do {
        unsigned char c = t.s[i];
        if (c == '"') {
            i = string_end(t, i, 0);
            if (i < 0) return -1;
            continue;
        }
        if (c == '[' || c == '{') {
            if (depth == MAX_DEPTH) return -1;
            stack[depth++] = c == '[' ? ']' : '}';
        } else if (c == ']' || c == '}') {
            if (depth == 0 || stack[depth - 1] != c) return -1;
            depth--;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
            return i;
        }
        i++;
    } while (i < t.n && (depth > 0 || (t.s[i] != ',' && t.s[i] != '}' && t.s[i] != ']' && t.s[i] != ' ' &&
                                      t.s[i] != '\t' && t.s[i] != '\n' && t.s[i] != '\r')));
    return depth == 0 ? i : -1;
}

typedef struct {
    Py_ssize_t start, stop; /* the bytes cut; stop == 0: not found yet */
} Cut;

/* The list at t.s[i] == '[': the bytes of its first `drop` elements (each `scalar` a number, else a
 * list of scalars) go to `cut`; the list's end, or -1. */
static Py_ssize_t trim_list(Text t, Py_ssize_t i, Py_ssize_t drop, int numbers, Cut *cut) {
    Py_ssize_t start = ws(t, i + 1), j = start;
    for (Py_ssize_t k = 0; k < drop; k++) {
        if (j >= t.n) return -1;
        if (numbers) {
            j = number_end(t, j);
        } else {
            j = t.s[j] == '[' ? scalar_list_end(t, j) : -1;
        }
        if (j < 0) return -1;
        j = ws(t, j);
        if (j >= t.n) return -1;
        if (t.s[j] == ',') {
            j = ws(t, j + 1);
        } else if (t.s[j] == ']') {
            if (k + 1 < drop) return -1; /* fewer elements than `drop` */
            cut->start = start;
            cut->stop = j;
            return j + 1;
        } else {
            return -1;
        }
    }
    cut->start = start;
    cut->stop = j;
    /* the rest of the list, as it is */
    if (j < t.n && t.s[j] == ']') return -1; /* a comma before the end: not JSON */
    return list_rest(t, j, value_end);
}

static int key_is(Text t, Py_ssize_t start, Py_ssize_t end, const char *key) {
    Py_ssize_t len = (Py_ssize_t)strlen(key);
    return end - start == len + 2 && memcmp(t.s + start + 1, key, (size_t)len) == 0;
}

/* The object at t.s[i] == '{', its keys walked: at the top `ids` and `meta` are looked for, in
 * meta_info `entries`. Its end, or -1 (a key seen twice, or one with an escape, included). */
static Py_ssize_t walk_object(Text t, Py_ssize_t i, Py_ssize_t drop, int top, Cut *ids, Cut *entries,
                              int *seen_meta) {
    i = ws(t, i + 1);
    if (i < t.n && t.s[i] == '}') return i + 1;
    for (;;) {
        if (i >= t.n || t.s[i] != '"') return -1;
        Py_ssize_t key_end = string_end(t, i, 0);
        if (key_end < 0 || memchr(t.s + i, '\\', (size_t)(key_end - i)) != NULL) return -1;
        Py_ssize_t j = ws(t, key_end);
        if (j >= t.n || t.s[j] != ':') return -1;
        j = ws(t, j + 1);
        if (j >= t.n) return -1;
        if (top && key_is(t, i, key_end, "output_ids")) {
            if (ids->stop || t.s[j] != '[') return -1;
            j = trim_list(t, j, drop, 1, ids);
        } else if (top && key_is(t, i, key_end, "meta_info")) {
            if (*seen_meta || t.s[j] != '{') return -1;
            *seen_meta = 1;
            j = walk_object(t, j, drop, 0, ids, entries, seen_meta);
        } else if (!top && key_is(t, i, key_end, "output_token_logprobs")) {
            if (entries->stop || t.s[j] != '[') return -1;
            j = trim_list(t, j, drop, 0, entries);
        } else {
            j = value_end(t, j);
        }
        if (j < 0) return -1;
        j = ws(t, j);
        if (j >= t.n) return -1;
        if (t.s[j] == '}') return j + 1;
        if (t.s[j] != ',') return -1;
        i = ws(t, j + 1);
    }
}

static PyObject *trim_event(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "trim_event(data, drop) takes 2 arguments");
        return NULL;
    }
    Py_ssize_t drop = PyLong_AsSsize_t(args[1]);
    if (drop == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Text t = {view.buf, view.len};
    PyObject *result = NULL;
    Cut ids = {0, 0}, entries = {0, 0};
    int seen_meta = 0;
    Py_ssize_t i = ws(t, 0);
    if (drop > 0 && i < t.n && t.s[i] == '{') {
        i = walk_object(t, i, drop, 1, &ids, &entries, &seen_meta);
        if (i >= 0 && ws(t, i) == t.n && ids.stop && entries.stop) {
            Cut *first = ids.start < entries.start ? &ids : &entries;
            Cut *second = first == &ids ? &entries : &ids;
            Py_ssize_t size = t.n - (first->stop - first->start) - (second->stop - second->start);
            result = PyBytes_FromStringAndSize(NULL, size);
            if (result != NULL) {
                char *out = PyBytes_AS_STRING(result);
                memcpy(out, t.s, (size_t)first->start);
                out += first->start;
                memcpy(out, t.s + first->stop, (size_t)(second->start - first->stop));
                out += second->start - first->stop;
                memcpy(out, t.s + second->stop, (size_t)(t.n - second->stop));
            }
        }
    }
    PyBuffer_Release(&view);
    if (result == NULL && !PyErr_Occurred()) result = Py_NewRef(Py_None);
    return result;
}

static PyMethodDef methods[] = {
    {"trim_event", (PyCFunction)(void (*)(void))trim_event, METH_FASTCALL,
     "trim_event(data, drop) -> bytes | None: the event without the first `drop` output tokens."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_trim", .m_size = 0, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__trim(void) { return PyModule_Create(&module); }
