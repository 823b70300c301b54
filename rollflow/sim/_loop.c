/* The serving simulator's loop in C: rollflow.sim._loop.run.
 *
 * The same simulation as ServingSimulator.run over the Python replicas, schedulers and decode
 * cohorts (rollflow/sim/simulator.py, replica.py, batching.py, cohort.py, request.py), for the
 * configurations most runs use: one pipeline stage, the vllm or sarathi scheduler with its
 * decode cohort, no prefix cache, routing on arrival or late binding, no completion hook. Each
 * function below names the Python method it follows; they take the same decisions in the same
 * order, create events in the same order (so ties keep the same sequence numbers), and time
 * batches with the compiled execution-time model (rollflow/perf/_timing.c, through its
 * capsule). Float arithmetic is Python's, operation for operation (-ffp-contract=off; Python's
 * float floor division is reproduced), so per-request times are bit-identical; tests compare
 * the two paths.
 *
 * rollflow/sim/compiled.py decides when this loop runs, passes it the cluster, and writes what it
 * returns back onto the Python objects. The router stays Python: it is called once per routed
 * request with the same frozen views the Python loop builds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>

#include "../perf/_timing_api.h"

static const TimingAPI *timing;

/* -- growable arrays ------------------------------------------------------------------------- */

/* `items`, a PyMem array of `item_size`-byte items, reallocated to hold `capacity` of them (which
 * `*capacity_out` then reads); NULL with MemoryError set if there is no memory (`items` kept). Every
 * growable array below grows through it, doubling (from an initial size when empty). */
static void *resize_array(void *items, size_t item_size, Py_ssize_t capacity, Py_ssize_t *capacity_out) {
    void *resized = PyMem_Realloc(items, item_size * (size_t)capacity);
    if (resized == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *capacity_out = capacity;
    return resized;
}

typedef struct {
    int *items;
    Py_ssize_t size, capacity;
} IntVec;

static int intvec_reserve(IntVec *v, Py_ssize_t capacity) {
    if (capacity <= v->capacity) return 0;
    int *items = resize_array(v->items, sizeof(int), capacity, &v->capacity);
    if (items == NULL) return -1;
    v->items = items;
    return 0;
}

static int intvec_push(IntVec *v, int value) {
    if (v->size == v->capacity && intvec_reserve(v, v->capacity ? 2 * v->capacity : 16) < 0) return -1;
    v->items[v->size++] = value;
    return 0;
}

typedef struct {
    long long *items;
    Py_ssize_t size, capacity;
} LongVec;

static int longvec_push(LongVec *v, long long value) {
    if (v->size == v->capacity) {
        Py_ssize_t capacity = v->capacity ? 2 * v->capacity : 16;
        long long *items = resize_array(v->items, sizeof(long long), capacity, &v->capacity);
        if (items == NULL) return -1;
        v->items = items;
    }
    v->items[v->size++] = value;
    return 0;
}

/* A ring buffer: the waiting queue (append, appendleft, popleft). */
typedef struct {
    int *items;
    Py_ssize_t head, size, capacity;
} IntDeque;

static int deque_grow(IntDeque *d) {
    Py_ssize_t capacity = d->capacity ? 2 * d->capacity : 16;
    int *items = PyMem_Malloc(sizeof(int) * capacity);
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < d->size; i++) items[i] = d->items[(d->head + i) % d->capacity];
    PyMem_Free(d->items);
    d->items = items;
    d->head = 0;
    d->capacity = capacity;
    return 0;
}

static int deque_append(IntDeque *d, int value) {
    if (d->size == d->capacity && deque_grow(d) < 0) return -1;
    d->items[(d->head + d->size++) % d->capacity] = value;
    return 0;
}

static int deque_appendleft(IntDeque *d, int value) {
    if (d->size == d->capacity && deque_grow(d) < 0) return -1;
    d->head = (d->head + d->capacity - 1) % d->capacity;
    d->items[d->head] = value;
    d->size++;
    return 0;
}

static int deque_first(const IntDeque *d) { return d->items[d->head]; }

static int deque_popleft(IntDeque *d) {
    int value = d->items[d->head];
    d->head = (d->head + 1) % d->capacity;
    d->size--;
    return value;
}

/* -- requests (SimRequest) ------------------------------------------------------------------- */

typedef struct {
    double arrived_at;
    long long id, prompt_tokens, output_tokens;
    long long num_prefill, num_decode, processed, blocks, decode_base, num_restarts;
    int prefill_done, replica_id;
    double scheduled_at, prefill_completed_at, completed_at; /* NAN: None */
    Py_ssize_t cohort_slot;                                  /* index in its cohort's members, or -1 */
    PyObject *prefix_key;                                    /* owned */
} Request;

static long long total_tokens(const Request *r) { return r->num_prefill + r->num_decode; }

/* SimRequest.on_iteration_end */
static void on_iteration_end(Request *r, double time, long long num_tokens) {
    r->processed += num_tokens;
    if (!r->prefill_done && r->processed == r->num_prefill) {
        r->prefill_done = 1;
        r->processed += 1;
        if (isnan(r->prefill_completed_at)) r->prefill_completed_at = time;
    }
    if (r->processed == r->num_prefill + r->num_decode) r->completed_at = time;
}

/* SimRequest.restart */
static void restart_request(Request *r) {
    long long total = r->num_prefill + r->num_decode;
    r->num_prefill = r->processed;
    r->num_decode = total - r->processed;
    r->processed = 0;
    r->prefill_done = 0;
    r->num_restarts += 1;
}

/* -- arithmetic as Python does it -------------------------------------------------------------- */

static long long floor_div(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static long long ceil_div(long long a, long long b) { return -floor_div(-a, b); }

/* Python's float `//` (CPython's float_floor_div), for cut_run's ceiling. */
static double py_float_floordiv(double vx, double wx) {
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod && ((wx < 0) != (mod < 0))) div -= 1.0;
    if (!div) return copysign(0.0, vx / wx);
    double floordiv = floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
}

/* -- binary min-heaps ------------------------------------------------------------------------ */

/* NAME_push and NAME_pop: a binary min-heap of TYPE in (*items, *size, *capacity), ordered by
 * BEFORE(a, b), growing by doubling from INITIAL. The event queue and each decode cohort's finish
 * order are such heaps; heapq's sift-down/sift-up order, so ties break as the Python twin's do. */
#define DEFINE_HEAP(NAME, TYPE, BEFORE, INITIAL)                                                   \
    static int NAME##_push(TYPE **items, Py_ssize_t *size, Py_ssize_t *capacity, TYPE item) {     \
        if (*size == *capacity) {                                                                  \
            Py_ssize_t grown = *capacity ? 2 * *capacity : (INITIAL);                              \
            TYPE *heap = resize_array(*items, sizeof(TYPE), grown, capacity);                      \
            if (heap == NULL) return -1;                                                           \
            *items = heap;                                                                         \
        }                                                                                          \
        TYPE *heap = *items;                                                                       \
        Py_ssize_t i = (*size)++;                                                                  \
        while (i > 0) {                                                                            \
            Py_ssize_t parent = (i - 1) / 2;                                                       \
            if (!BEFORE(&item, &heap[parent])) break;                                              \
            heap[i] = heap[parent];                                                                \
            i = parent;                                                                            \
        }                                                                                          \
        heap[i] = item;                                                                            \
        return 0;                                                                                  \
    }                                                                                              \
    static TYPE NAME##_pop(TYPE *heap, Py_ssize_t *size) {                                         \
        TYPE top = heap[0], last = heap[--*size];                                                  \
        Py_ssize_t i = 0, n = *size;                                                               \
        for (;;) {                                                                                 \
            Py_ssize_t child = 2 * i + 1;                                                          \
            if (child >= n) break;                                                                 \
            if (child + 1 < n && BEFORE(&heap[child + 1], &heap[child])) child++;                  \
            if (!BEFORE(&heap[child], &last)) break;                                               \
            heap[i] = heap[child];                                                                 \
            i = child;                                                                             \
        }                                                                                          \
        if (n) heap[i] = last;                                                                     \
        return top;                                                                                \
    }

/* -- the decode cohort (DecodeCohort) --------------------------------------------------------- */

static long long mod_block(long long value, long long block) { return value - floor_div(value, block) * block; }

typedef struct {
    long long finish;
    double arrived_at;
    long long id;
    int request;
} FinishEntry;

static int finish_before(const FinishEntry *a, const FinishEntry *b) {
    if (a->finish != b->finish) return a->finish < b->finish;
    if (a->arrived_at != b->arrived_at) return a->arrived_at < b->arrived_at;
    return a->id < b->id;
}

DEFINE_HEAP(finish_heap, FinishEntry, finish_before, 16)

typedef struct {
    long long block_size, clock, base_sum;
    long long *phase_counts;
    IntVec members;
    FinishEntry *heap;
    Py_ssize_t heap_size, heap_capacity;
} Cohort;

static int cohort_join(Cohort *c, Request *requests, int index) {
    Request *r = &requests[index];
    long long base = r->processed - c->clock;
    r->decode_base = base;
    r->cohort_slot = c->members.size;
    if (intvec_push(&c->members, index) < 0) return -1;
    c->base_sum += base;
    c->phase_counts[mod_block(base, c->block_size)] += 1;
    FinishEntry entry = {r->num_prefill + r->num_decode - base, r->arrived_at, r->id, index};
    return finish_heap_push(&c->heap, &c->heap_size, &c->heap_capacity, entry);
}

static long long cohort_blocks_needed(const Cohort *c, long long iterations) {
    long long block = c->block_size;
    const long long *counts = c->phase_counts;
    if (iterations == 1) return counts[mod_block(1 - c->clock, block)];
    long long cycles = floor_div(iterations, block), rest = iterations - cycles * block;
    long long total = cycles * (long long)c->members.size;
    if (rest) {
        long long start = mod_block(1 - c->clock, block), first = start - rest + 1;
        if (first >= 0) {
            for (long long k = first; k <= start; k++) total += counts[k];
        } else {
            for (long long k = 0; k <= start; k++) total += counts[k];
            for (long long k = block + first; k < block; k++) total += counts[k];
        }
    }
    return total;
}

static long long cohort_iterations_to_next_finish(const Cohort *c) {
    return c->heap_size ? c->heap[0].finish - c->clock : 0;
}

static void cohort_materialise(const Cohort *c, Request *r) {
    r->processed = r->decode_base + c->clock;
    r->blocks = -floor_div(-(r->processed - 1), c->block_size);
}

static void cohort_remove(Cohort *c, Request *requests, int index) {
    Request *r = &requests[index];
    Py_ssize_t slot = r->cohort_slot, last = c->members.size - 1;
    int moved = c->members.items[last];
    c->members.items[slot] = moved;
    requests[moved].cohort_slot = slot;
    c->members.size--;
    r->cohort_slot = -1;
    c->base_sum -= r->decode_base;
    c->phase_counts[mod_block(r->decode_base, c->block_size)] -= 1;
    cohort_materialise(c, r);
}

/* DecodeCohort.advance: members that completed go to `finished`, in finishing order. */
static int cohort_advance(Cohort *c, Request *requests, long long iterations, double now, IntVec *finished) {
    c->clock += iterations;
    while (c->heap_size && c->heap[0].finish <= c->clock) {
        int index = finish_heap_pop(c->heap, &c->heap_size).request;
        cohort_remove(c, requests, index);
        requests[index].completed_at = now;
        if (intvec_push(finished, index) < 0) return -1;
    }
    return 0;
}

static const Request *sort_requests; /* qsort's comparators read the requests through this */

static int by_arrival_then_id(const void *a, const void *b) {
    const Request *x = &sort_requests[*(const int *)a], *y = &sort_requests[*(const int *)b];
    if (x->arrived_at != y->arrived_at) return x->arrived_at < y->arrived_at ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* DecodeCohort.release_all: every member, materialised, appended to `out` in arrival order. */
static int cohort_release_all(Cohort *c, Request *requests, IntVec *out) {
    Py_ssize_t n = c->members.size, start = out->size;
    if (intvec_reserve(out, start + n) < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int index = c->members.items[i];
        cohort_materialise(c, &requests[index]);
        requests[index].cohort_slot = -1;
        out->items[start + i] = index;
    }
    sort_requests = requests;
    qsort(out->items + start, n, sizeof(int), by_arrival_then_id);
    out->size = start + n;
    c->members.size = 0;
    c->heap_size = 0;
    c->base_sum = 0;
    for (long long k = 0; k < c->block_size; k++) c->phase_counts[k] = 0;
    return 0;
}

/* -- one batch (IterationBatch): a replica with one stage has at most one in flight ---------------------- */

typedef struct {
    IntVec requests;
    LongVec num_tokens;
    long long cohort_size, cohort_kv_sum, num_prefill_tokens, size, tokens_per_iteration;
    long long num_iterations, attention_pairs, prefill_pair_growth, decode_size, decode_kv_sum;
    PieceVec pieces;
    double scheduled_at, end_time, last_stage_s, wakeup_s;
    long long serial; /* which batch of its replica: with `version`, what a stage end is about */
    long long version;
} IterationBatch;

/* -- one replica (Replica and its ReplicaScheduler) ------------------------------------------- */

enum { SARATHI = 0, VLLM = 1 };

typedef struct {
    /* configuration */
    PyObject *timer;
    int policy, fast_forward;
    long long num_blocks, block_size, batch_size_cap, max_micro_batch_size, watermark_blocks;
    long long chunk_size, max_tokens_in_batch;
    double idle_wakeup_s, idle_wakeup_ramp_s, admission_s, smoothing;
    long long flops_per_token, attention_flops_per_pair;
    PyObject *kind;
    /* scheduler */
    IntDeque waiting;
    IntVec running, prefilling, skipped, completed;
    long long num_allocated_blocks, num_resident, waiting_tokens, resident_remaining_tokens;
    long long num_preemptions, cohort_first_blocks;
    Cohort cohort;
    Prefill *prefills;
    Py_ssize_t prefills_capacity;
    /* replica */
    int batch_running, schedule_pending, run_in_flight;
    IterationBatch batch;
    double tokens_per_s, idle_since;
    double busy_s, flops;
    long long num_iterations, decode_tokens;
    PyObject *batches, *kv_samples; /* the stats' lists, as ReplicaStats keeps them */
    /* membership (a Cluster's instances come and go; the closed loop's never do) */
    int accepting, retiring, retired, is_local;
} Replica;

/* ReplicaScheduler._allocate */
static void allocate(Replica *rep, Request *r, long long num_blocks) {
    if (r->blocks == 0) {
        rep->num_resident += 1;
        rep->resident_remaining_tokens += total_tokens(r) - r->processed;
    }
    r->blocks += num_blocks;
    rep->num_allocated_blocks += num_blocks;
}

/* ReplicaScheduler.free (no prefix cache) */
static void free_request(Replica *rep, Request *r) {
    rep->num_allocated_blocks -= r->blocks;
    rep->resident_remaining_tokens -= total_tokens(r) - r->processed;
    r->blocks = 0;
    rep->num_resident -= 1;
}

static int can_admit_or_grow(const Replica *rep, const Request *r) {
    if (r->blocks == 0) {
        long long needed = ceil_div(r->num_prefill, rep->block_size);
        return rep->num_blocks - rep->num_allocated_blocks - needed >= rep->watermark_blocks;
    }
    return rep->num_blocks - rep->num_allocated_blocks >= 1;
}

static void admit_or_grow(Replica *rep, Request *r) {
    if (r->blocks == 0)
        allocate(rep, r, ceil_div(r->num_prefill, rep->block_size));
    else if (r->processed > r->blocks * rep->block_size)
        allocate(rep, r, 1);
}

/* ReplicaScheduler._restart */
static int restart(Replica *rep, Request *requests, int index) {
    Request *r = &requests[index];
    rep->num_preemptions += 1;
    free_request(rep, r);
    restart_request(r);
    if (deque_appendleft(&rep->waiting, index) < 0) return -1;
    rep->waiting_tokens += total_tokens(r);
    return 0;
}

/* ReplicaScheduler._preempt_for: 1 if the request got its block, 0 if it lost it, -1 on error. */
static int preempt_for(Replica *rep, Request *requests, int index) {
    Request *r = &requests[index];
    while (!can_admit_or_grow(rep, r)) {
        if (rep->running.size) {
            if (restart(rep, requests, rep->running.items[--rep->running.size]) < 0) return -1;
        } else {
            return restart(rep, requests, index) < 0 ? -1 : 0;
        }
    }
    admit_or_grow(rep, r);
    return 1;
}

static int pop_waiting(Replica *rep, Request *requests) {
    int index = deque_popleft(&rep->waiting);
    rep->waiting_tokens -= total_tokens(&requests[index]);
    return index;
}

/* ReplicaScheduler._schedule_cohort: decoding requests scheduled in aggregate, or -1 on error. */
static long long schedule_cohort(Replica *rep, Request *requests) {
    Cohort *c = &rep->cohort;
    IntVec *running = &rep->running;
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < running->size; i++) {
        int index = running->items[i];
        if (requests[index].prefill_done) {
            if (cohort_join(c, requests, index) < 0) return -1;
        } else {
            running->items[kept++] = index;
        }
    }
    running->size = kept;
    long long size = c->members.size;
    if (!size) return 0;
    long long needed = cohort_blocks_needed(c, 1);
    if (size < rep->max_micro_batch_size && rep->num_blocks - rep->num_allocated_blocks - needed >= 1) {
        rep->num_allocated_blocks += needed;
        rep->cohort_first_blocks = needed;
        return size;
    }
    return cohort_release_all(c, requests, running) < 0 ? -1 : 0;
}

/* running.sort(key=_arrival): stable, and nearly sorted already. */
static void sort_by_arrival(IntVec *v, const Request *requests) {
    for (Py_ssize_t i = 1; i < v->size; i++) {
        int index = v->items[i];
        double arrived = requests[index].arrived_at;
        Py_ssize_t j = i;
        while (j > 0 && requests[v->items[j - 1]].arrived_at > arrived) {
            v->items[j] = v->items[j - 1];
            j--;
        }
        v->items[j] = index;
    }
}

static int batch_add(IterationBatch *b, int index, long long tokens) {
    return intvec_push(&b->requests, index) < 0 || longvec_push(&b->num_tokens, tokens) < 0 ? -1 : 0;
}

/* ReplicaScheduler._batch and IterationBatch.__init__: 1 if a batch formed, 0 if it is empty.
 * `num_prefill_tokens` < 0: summed here over the requests still prefilling. */
static int close_batch(Replica *rep, Request *requests, long long cohort_size, long long num_prefill_tokens) {
    IterationBatch *b = &rep->batch;
    if (!b->requests.size && !cohort_size) return 0;
    b->cohort_size = cohort_size;
    b->cohort_kv_sum = cohort_size ? rep->cohort.base_sum + (long long)rep->cohort.members.size * rep->cohort.clock
                                   : 0;
    long long token_sum = 0;
    if (num_prefill_tokens < 0) {
        num_prefill_tokens = 0;
        for (Py_ssize_t i = 0; i < b->requests.size; i++)
            if (!requests[b->requests.items[i]].prefill_done) num_prefill_tokens += b->num_tokens.items[i];
    }
    for (Py_ssize_t i = 0; i < b->num_tokens.size; i++) token_sum += b->num_tokens.items[i];
    b->num_prefill_tokens = num_prefill_tokens;
    b->size = b->requests.size + cohort_size;
    b->tokens_per_iteration = token_sum + cohort_size;
    b->num_iterations = 1;
    b->pieces.size = 0;
    b->scheduled_at = b->end_time = b->last_stage_s = b->wakeup_s = 0.0;
    b->attention_pairs = b->prefill_pair_growth = b->decode_size = b->decode_kv_sum = 0;
    b->serial += 1;
    b->version = 0;
    return 1;
}

/* SarathiScheduler._chunk */
static long long sarathi_chunk(const Replica *rep, const Request *r, long long batch_tokens) {
    if (r->prefill_done) return 1;
    long long left = r->num_prefill - r->processed, budget = rep->chunk_size - batch_tokens;
    long long tokens = left < budget ? left : budget;
    return tokens > 0 ? tokens : 0;
}

/* SarathiScheduler.next_batch */
static int sarathi_next_batch(Replica *rep, Request *requests) {
    IterationBatch *b = &rep->batch;
    b->requests.size = b->num_tokens.size = 0;
    rep->prefilling.size = rep->skipped.size = 0;
    long long cohort_size = schedule_cohort(rep, requests);
    if (cohort_size < 0) return -1;
    long long batch_tokens = cohort_size;
    IntVec *running = &rep->running;
    sort_by_arrival(running, requests);
    Py_ssize_t next = 0; /* running.pop(0), as an index into the sorted list */
    while (next < running->size && b->requests.size + cohort_size < rep->max_micro_batch_size) {
        int index = running->items[next++];
        if (!requests[index].prefill_done) {
            if (intvec_push(&rep->prefilling, index) < 0) return -1;
            continue;
        }
        /* _preempt_for pops from the end of `running`: the part not yet taken */
        Py_ssize_t taken = next;
        memmove(running->items, running->items + taken, sizeof(int) * (running->size - taken));
        running->size -= taken;
        next = 0;
        int got = preempt_for(rep, requests, index);
        if (got < 0) return -1;
        if (got) {
            batch_tokens += 1;
            if (batch_add(b, index, 1) < 0) return -1;
        }
    }
    memmove(running->items, running->items + next, sizeof(int) * (running->size - next));
    running->size -= next;
    long long prefill_tokens = 0;
    for (Py_ssize_t i = 0; i < rep->prefilling.size; i++) {
        int index = rep->prefilling.items[i];
        long long tokens = sarathi_chunk(rep, &requests[index], batch_tokens);
        if (tokens == 0) {
            if (intvec_push(&rep->skipped, index) < 0) return -1;
            continue;
        }
        batch_tokens += tokens;
        prefill_tokens += tokens;
        if (batch_add(b, index, tokens) < 0) return -1;
    }
    if (rep->skipped.size) { /* running[:0] = skipped */
        Py_ssize_t n = rep->skipped.size;
        if (intvec_reserve(running, running->size + n) < 0) return -1;
        memmove(running->items + n, running->items, sizeof(int) * running->size);
        memcpy(running->items, rep->skipped.items, sizeof(int) * n);
        running->size += n;
    }
    while (rep->waiting.size) {
        if (rep->num_resident == rep->batch_size_cap ||
            b->requests.size + cohort_size == rep->max_micro_batch_size)
            break;
        int index = deque_first(&rep->waiting);
        Request *r = &requests[index];
        if (!can_admit_or_grow(rep, r)) break;
        long long tokens = sarathi_chunk(rep, r, batch_tokens);
        if (tokens == 0) break;
        pop_waiting(rep, requests);
        admit_or_grow(rep, r);
        batch_tokens += tokens;
        if (!r->prefill_done) prefill_tokens += tokens;
        if (batch_add(b, index, tokens) < 0) return -1;
    }
    return close_batch(rep, requests, cohort_size, prefill_tokens);
}

/* VllmScheduler.next_batch */
static int vllm_next_batch(Replica *rep, Request *requests) {
    IterationBatch *b = &rep->batch;
    b->requests.size = b->num_tokens.size = 0;
    long long longest = 0;
    while (rep->waiting.size) {
        int index = deque_first(&rep->waiting);
        Request *r = &requests[index];
        if (!can_admit_or_grow(rep, r)) break;
        long long tokens = r->prefill_done ? 1 : r->num_prefill - r->processed;
        long long widest = longest > tokens ? longest : tokens;
        if ((b->requests.size + 1) * widest > rep->max_tokens_in_batch) break;
        if (rep->num_resident == rep->batch_size_cap || b->requests.size == rep->max_micro_batch_size) break;
        pop_waiting(rep, requests);
        admit_or_grow(rep, r);
        if (batch_add(b, index, tokens) < 0) return -1;
        longest = widest;
    }
    if (b->requests.size) return close_batch(rep, requests, 0, -1);
    long long cohort_size = schedule_cohort(rep, requests);
    if (cohort_size < 0) return -1;
    IntVec *running = &rep->running;
    sort_by_arrival(running, requests);
    while (running->size && b->requests.size + cohort_size < rep->max_micro_batch_size) {
        int index = running->items[0];
        memmove(running->items, running->items + 1, sizeof(int) * (running->size - 1));
        running->size -= 1;
        int got = preempt_for(rep, requests, index);
        if (got < 0) return -1;
        if (got) {
            const Request *r = &requests[index];
            if (batch_add(b, index, r->prefill_done ? 1 : r->num_prefill - r->processed) < 0) return -1;
        }
    }
    return close_batch(rep, requests, cohort_size, -1);
}

/* ReplicaScheduler._waiting_blocked and its subclasses' */
static int waiting_blocked(const Replica *rep, const Request *requests) {
    const IterationBatch *b = &rep->batch;
    const Request *head = &requests[deque_first(&rep->waiting)];
    if (rep->num_resident == rep->batch_size_cap || b->size >= rep->max_micro_batch_size ||
        !can_admit_or_grow(rep, head))
        return 1;
    if (rep->policy == VLLM) return head->num_prefill > rep->max_tokens_in_batch;
    return b->size >= rep->chunk_size;
}

/* SarathiScheduler._chunk_run_limit (the base class's is 1) */
static long long chunk_run_limit(const Replica *rep, const Request *requests) {
    const IterationBatch *b = &rep->batch;
    if (rep->policy != SARATHI || b->requests.size != 1) return 1;
    const Request *r = &requests[b->requests.items[0]];
    long long tokens = b->num_tokens.items[0];
    if (r->prefill_done || tokens + b->cohort_size != rep->chunk_size) return 1;
    return floor_div(r->num_prefill - r->processed - 1, tokens);
}

/* ReplicaScheduler.plan_run */
static long long plan_run(const Replica *rep, const Request *requests) {
    const IterationBatch *b = &rep->batch;
    const Cohort *c = &rep->cohort;
    if (!b->cohort_size) return 1;
    long long limit = cohort_iterations_to_next_finish(c);
    if (b->requests.size) {
        long long chunk_limit = chunk_run_limit(rep, requests);
        if (chunk_limit < limit) limit = chunk_limit;
    } else if (rep->waiting.size && !waiting_blocked(rep, requests)) {
        return 1;
    }
    if (limit <= 1) return 1;
    long long first = rep->cohort_first_blocks;
    long long free_blocks = rep->num_blocks - rep->num_allocated_blocks - 1;
    if (cohort_blocks_needed(c, limit) - first <= free_blocks) return limit;
    long long lo = 1, hi = limit;
    while (lo < hi) {
        long long mid = (lo + hi + 1) / 2;
        if (cohort_blocks_needed(c, mid) - first <= free_blocks)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* _run_seconds: summed left to right, as the Python reference does */
static double run_seconds(const PieceVec *pieces) {
    if (pieces->size == 1) return (double)pieces->items[0].count * pieces->items[0].seconds;
    double total = 0.0;
    for (Py_ssize_t i = 0; i < pieces->size; i++) total += (double)pieces->items[i].count * pieces->items[i].seconds;
    return total;
}

/* _first_iteration_longer */
static int first_iteration_longer(PieceVec *pieces, double extra) {
    Piece first = pieces->items[0];
    if (first.count > 1) { /* (1, s + extra), (count - 1, s), rest: one more piece */
        if (pieces->size == pieces->capacity) {
            Piece *items = resize_array(pieces->items, sizeof(Piece), 2 * pieces->capacity, &pieces->capacity);
            if (items == NULL) return -1;
            pieces->items = items;
        }
        memmove(pieces->items + 1, pieces->items, sizeof(Piece) * pieces->size);
        pieces->size += 1;
        pieces->items[1].count = first.count - 1;
    }
    pieces->items[0] = (Piece){1, first.seconds + extra};
    return 0;
}

/* Replica._time_batch */
static int time_batch(Replica *rep, Request *requests) {
    IterationBatch *b = &rep->batch;
    long long decode_size = b->cohort_size, kv_sum = b->cohort_kv_sum, pairs = 0, admitted = 0;
    Py_ssize_t num_prefills = 0;
    if (rep->prefills_capacity < b->requests.size) {
        Prefill *prefills = PyMem_Realloc(rep->prefills, sizeof(Prefill) * b->requests.size);
        if (prefills == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        rep->prefills = prefills;
        rep->prefills_capacity = b->requests.size;
    }
    for (Py_ssize_t i = 0; i < b->requests.size; i++) {
        const Request *r = &requests[b->requests.items[i]];
        long long tokens = b->num_tokens.items[i];
        if (r->prefill_done) {
            decode_size += 1;
            kv_sum += r->processed;
        } else {
            rep->prefills[num_prefills++] = (Prefill){r->processed, tokens};
            pairs += tokens * (tokens + r->processed);
            if (isnan(r->scheduled_at)) admitted += 1;
        }
    }
    double admission = admitted && decode_size ? rep->admission_s * (double)admitted : 0.0;
    b->decode_size = decode_size;
    b->decode_kv_sum = kv_sum;
    b->attention_pairs = pairs;
    if (rep->fast_forward && num_prefills <= 1) {
        long long iterations = plan_run(rep, requests);
        if (iterations > 1) {
            b->num_iterations = iterations;
            int status;
            if (num_prefills) {
                long long chunk = rep->prefills[0].chunk;
                b->prefill_pair_growth = chunk * chunk;
                status = timing->chunk_run(rep->timer, decode_size, kv_sum, rep->prefills[0].cached, chunk,
                                           iterations, &b->pieces);
            } else {
                status = timing->decode_run(rep->timer, decode_size, kv_sum, iterations, &b->pieces);
            }
            if (status < 0) return -1;
            if (admission && first_iteration_longer(&b->pieces, admission) < 0) return -1;
            b->last_stage_s = run_seconds(&b->pieces);
            return 0;
        }
    }
    double last;
    if (timing->stage_seconds(rep->timer, b->tokens_per_iteration, decode_size, kv_sum, rep->prefills,
                              num_prefills, 1, &last) < 0)
        return -1;
    if (admission) last += admission;
    b->pieces.size = 0;
    if (b->pieces.capacity == 0) {
        b->pieces.items = PyMem_Malloc(sizeof(Piece) * 8);
        if (b->pieces.items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->pieces.capacity = 8;
    }
    b->pieces.items[b->pieces.size++] = (Piece){1, last};
    b->last_stage_s = last;
    return 0;
}

/* Replica.form_batches (one stage): 1 if a batch formed, 0 if not, -1 on error. */
static int form_batch(Replica *rep, Request *requests, double now) {
    if (rep->batch_running) return 0;
    double wakeup = 0.0;
    if (rep->idle_wakeup_s) {
        double idle = (now - rep->idle_since) / rep->idle_wakeup_ramp_s;
        wakeup = rep->idle_wakeup_s * (idle < 1.0 ? idle : 1.0);
    }
    int formed = rep->policy == SARATHI ? sarathi_next_batch(rep, requests) : vllm_next_batch(rep, requests);
    if (formed <= 0) return formed;
    IterationBatch *b = &rep->batch;
    rep->batch_running = 1;
    if (time_batch(rep, requests) < 0) return -1;
    if (wakeup) {
        b->wakeup_s = wakeup;
        b->scheduled_at = now + wakeup;
    } else {
        b->scheduled_at = now;
    }
    for (Py_ssize_t i = 0; i < b->requests.size; i++) {
        Request *r = &requests[b->requests.items[i]];
        if (isnan(r->scheduled_at)) r->scheduled_at = now;
    }
    PyObject *sample = Py_BuildValue("(ddnL)", now, (double)rep->num_allocated_blocks / (double)rep->num_blocks,
                                     rep->waiting.size, rep->num_resident);
    if (sample == NULL) return -1;
    int status = PyList_Append(rep->kv_samples, sample);
    Py_DECREF(sample);
    return status < 0 ? -1 : 1;
}

/* ReplicaScheduler.finish: completed requests appended to rep->completed. */
static int scheduler_finish(Replica *rep, Request *requests, double now) {
    IterationBatch *b = &rep->batch;
    long long iterations = b->num_iterations, processed = 0;
    Cohort *c = &rep->cohort;
    IntVec *completed = &rep->completed;
    completed->size = 0;
    if (b->cohort_size) {
        if (iterations > 1) rep->num_allocated_blocks += cohort_blocks_needed(c, iterations) - rep->cohort_first_blocks;
        if (cohort_advance(c, requests, iterations, now, completed) < 0) return -1;
        for (Py_ssize_t i = 0; i < completed->size; i++) free_request(rep, &requests[completed->items[i]]);
        processed += iterations * b->cohort_size;
    }
    for (Py_ssize_t i = 0; i < b->requests.size; i++) {
        Request *r = &requests[b->requests.items[i]];
        long long tokens = b->num_tokens.items[i];
        if (iterations > 1) {
            r->processed += iterations * tokens;
            if (r->processed == r->num_prefill + r->num_decode) r->completed_at = now;
            processed += iterations * tokens;
        } else {
            long long before = r->processed;
            on_iteration_end(r, now, tokens);
            processed += r->processed - before;
        }
    }
    rep->resident_remaining_tokens -= processed;
    for (Py_ssize_t i = 0; i < b->requests.size; i++) {
        int index = b->requests.items[i];
        Request *r = &requests[index];
        if (!isnan(r->completed_at)) {
            free_request(rep, r);
            if (intvec_push(completed, index) < 0) return -1;
        } else if (r->prefill_done) {
            if (cohort_join(c, requests, index) < 0) return -1;
        } else if (intvec_push(&rep->running, index) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Replica._flops: exact integers, converted once as Python's float += int does. */
static double batch_flops(const Replica *rep) {
    const IterationBatch *b = &rep->batch;
    __int128 n = b->num_iterations, size = b->decode_size;
    __int128 decode_pairs = size * n + n * b->decode_kv_sum + size * n * (n - 1) / 2;
    __int128 pairs = b->attention_pairs * n + b->prefill_pair_growth * n * (n - 1) / 2 + decode_pairs;
    __int128 tokens = b->tokens_per_iteration * n;
    return (double)(rep->flops_per_token * tokens + rep->attention_flops_per_pair * pairs);
}

/* Replica.finish_batch */
static int finish_batch(Replica *rep, Request *requests, double now) {
    IterationBatch *b = &rep->batch;
    if (scheduler_finish(rep, requests, now) < 0) return -1;
    rep->batch_running = 0;
    rep->idle_since = now;
    rep->busy_s += b->last_stage_s;
    rep->num_iterations += b->num_iterations;
    rep->decode_tokens += (b->tokens_per_iteration - b->num_prefill_tokens) * b->num_iterations;
    PyObject *row = Py_BuildValue("(ddLLLL)", b->scheduled_at, now - b->scheduled_at, b->size,
                                  b->tokens_per_iteration, b->num_prefill_tokens, b->num_iterations);
    if (row == NULL) return -1;
    int status = PyList_Append(rep->batches, row);
    Py_DECREF(row);
    if (status < 0) return -1;
    rep->flops += batch_flops(rep);
    double elapsed = now - b->scheduled_at;
    if (elapsed > 0) {
        double rate = (double)(b->tokens_per_iteration * b->num_iterations) / elapsed;
        rep->tokens_per_s += rep->smoothing * (rate - rep->tokens_per_s);
    }
    rep->run_in_flight = 0;
    return 0;
}

/* Replica.iterations_done */
static long long iterations_done(const IterationBatch *b, double now) {
    long long done = 0;
    double clock = b->scheduled_at;
    for (Py_ssize_t i = 0; i < b->pieces.size; i++) {
        long long count = b->pieces.items[i].count;
        double seconds = b->pieces.items[i].seconds;
        if (clock + (double)count * seconds <= now) {
            done += count;
            clock += (double)count * seconds;
            continue;
        }
        long long partial = (long long)((now - clock) / seconds);
        return done + (partial > 0 ? partial : 0);
    }
    return done;
}

/* Replica.cut_run: 1 if the run in flight now ends at the first iteration boundary >= now. */
static int cut_run(IterationBatch *b, double now) {
    double clock = b->scheduled_at;
    long long total = 0;
    for (Py_ssize_t i = 0; i < b->pieces.size; i++) {
        long long count = b->pieces.items[i].count;
        double seconds = b->pieces.items[i].seconds;
        double end = clock + (double)count * seconds;
        if (end < now) {
            total += count;
            clock = end;
            continue;
        }
        long long needed = -(long long)py_float_floordiv(-(now - clock), seconds);
        if (needed < 1) needed = 1;
        while (needed < count && clock + (double)needed * seconds < now) needed++;
        total += needed;
        if (total == b->num_iterations) return 0;
        b->pieces.items[i].count = needed;
        b->pieces.size = i + 1;
        b->last_stage_s = run_seconds(&b->pieces);
        b->num_iterations = total;
        b->end_time = clock + (double)needed * seconds;
        b->version += 1;
        return 1;
    }
    return 0;
}

/* -- the event loop (ServingSimulator) ---------------------------------------------------------- */

enum { ARRIVAL = 0, STAGE_END = 1, SCHEDULE = 2 }; /* Phase */

typedef struct {
    double time;
    int phase;
    long long seq;
    int target;             /* replica, or the request of an arrival */
    long long serial, version; /* a stage end's batch */
} Event;

typedef struct {
    Request *requests;
    Py_ssize_t num_requests;
    Replica *replicas;
    Py_ssize_t num_replicas;
    Event *heap;
    Py_ssize_t heap_size, heap_capacity;
    long long next_seq, num_events, completed, progress_every;
    double now, overhead_s;
    PyObject *pick, *route_type, *instance_view_type, *cluster_view_type, *id_views, *on_progress;
    PyObject *zero;
    int reads_load;
    int late_binding; /* dispatch from one cluster queue to instances below `capacity` requests */
    long long capacity;
    IntDeque cluster_queue;
    /* a Cluster (below): the SimRequest of each request slot, and what the Python side must hear
     * of (completions, stopped instances); NULL in the closed loop */
    PyObject *request_objects, *reports;
    char *live; /* per request slot: on an instance, not yet written back for good */
} Loop;

static int event_before(const Event *a, const Event *b) {
    if (a->time != b->time) return a->time < b->time;
    if (a->phase != b->phase) return a->phase < b->phase;
    return a->seq < b->seq;
}

DEFINE_HEAP(event_heap, Event, event_before, 64)

static int push_event(Loop *loop, double time, int phase, int target, long long serial, long long version) {
    Event event = {time, phase, loop->next_seq++, target, serial, version};
    return event_heap_push(&loop->heap, &loop->heap_size, &loop->heap_capacity, event);
}

static Event pop_event(Loop *loop) { return event_heap_pop(loop->heap, &loop->heap_size); }

/* _start_stage (one stage): the formed batch starts once the replica is awake. */
static int start_batch(Loop *loop, int replica_id) {
    Replica *rep = &loop->replicas[replica_id];
    IterationBatch *b = &rep->batch;
    double end = loop->now + b->wakeup_s + b->last_stage_s;
    b->end_time = end;
    if (b->num_iterations > 1) rep->run_in_flight = 1;
    return push_event(loop, end, STAGE_END, replica_id, b->serial, b->version);
}

/* _schedule */
static int stop_replica(Loop *loop, int replica_id);

static int schedule(Loop *loop, int replica_id) {
    Replica *rep = &loop->replicas[replica_id];
    if (rep->retiring) return stop_replica(loop, replica_id); /* stop at this iteration boundary */
    if (rep->retired) return 0;
    rep->schedule_pending = 0;
    int formed = form_batch(rep, loop->requests, loop->now);
    if (formed <= 0) return formed;
    return start_batch(loop, replica_id);
}

/* _request_schedule */
static int request_schedule(Loop *loop, int replica_id) {
    Replica *rep = &loop->replicas[replica_id];
    if (rep->schedule_pending || rep->batch_running) return 0;
    rep->schedule_pending = 1;
    return push_event(loop, loop->now, SCHEDULE, replica_id, 0, 0);
}

/* _cut_run */
static int cut_run_in_flight(Loop *loop, int replica_id) {
    Replica *rep = &loop->replicas[replica_id];
    IterationBatch *b = &rep->batch;
    if (!rep->run_in_flight || !cut_run(b, loop->now)) return 0;
    return push_event(loop, b->end_time, STAGE_END, replica_id, b->serial, b->version);
}

/* A NamedTuple of `type` from a tuple of all its fields (stolen), as tuple.__new__ builds it. */
static PyObject *new_named(PyObject *type, PyObject *fields) {
    if (fields == NULL) return NULL;
    PyObject *args = PyTuple_Pack(1, fields);
    Py_DECREF(fields);
    if (args == NULL) return NULL;
    PyObject *object = PyTuple_Type.tp_new((PyTypeObject *)type, args, NULL);
    Py_DECREF(args);
    return object;
}

/* Replica.view */
static PyObject *instance_view(Loop *loop, int replica_id) {
    Replica *rep = &loop->replicas[replica_id];
    long long running_tokens = rep->resident_remaining_tokens;
    if (rep->run_in_flight) running_tokens -= iterations_done(&rep->batch, loop->now) * rep->batch.tokens_per_iteration;
    return new_named(loop->instance_view_type,
                     Py_BuildValue("(nLnLLddOOO)", (Py_ssize_t)replica_id, rep->num_resident, rep->waiting.size,
                                   rep->waiting_tokens, running_tokens,
                                   (double)rep->num_allocated_blocks / (double)rep->num_blocks, rep->tokens_per_s,
                                   rep->kind, loop->zero, loop->zero));
}

/* The router's pick for request `index` among `instances` (a tuple of views, stolen). */
static Py_ssize_t pick(Loop *loop, int index, PyObject *instances) {
    const Request *r = &loop->requests[index];
    if (instances == NULL) return -1;
    PyObject *snapshot = new_named(loop->cluster_view_type, Py_BuildValue("(dN)", loop->now, instances));
    PyObject *request = new_named(loop->route_type, Py_BuildValue("(LLLO)", r->id, r->prompt_tokens,
                                                                  r->output_tokens, r->prefix_key));
    PyObject *picked = NULL;
    if (snapshot != NULL && request != NULL) picked = PyObject_CallFunctionObjArgs(loop->pick, request, snapshot, NULL);
    Py_XDECREF(snapshot);
    Py_XDECREF(request);
    if (picked == NULL) return -1;
    Py_ssize_t target = PyNumber_AsSsize_t(picked, PyExc_OverflowError);
    Py_DECREF(picked);
    if (target == -1 && PyErr_Occurred()) return -1;
    if (target < 0 || target >= loop->num_replicas) {
        PyErr_Format(PyExc_ValueError, "the router picked instance %zd, not one of the %zd instances", target,
                     loop->num_replicas);
        return -1;
    }
    return target;
}

/* _place */
static int place(Loop *loop, int index, int target) {
    Replica *rep = &loop->replicas[target];
    Request *r = &loop->requests[index];
    r->replica_id = target;
    if (deque_append(&rep->waiting, index) < 0) return -1;
    rep->waiting_tokens += total_tokens(r);
    if (cut_run_in_flight(loop, target) < 0) return -1;
    return request_schedule(loop, target);
}

/* _route on arrival: every instance in the snapshot (views, or ids only for routers that read no load). */
static int route(Loop *loop, int index) {
    PyObject *instances;
    if (loop->reads_load) {
        instances = PyTuple_New(loop->num_replicas);
        for (Py_ssize_t i = 0; instances != NULL && i < loop->num_replicas; i++) {
            PyObject *view = instance_view(loop, (int)i);
            if (view == NULL) Py_CLEAR(instances);
            else PyTuple_SET_ITEM(instances, i, view);
        }
    } else {
        instances = Py_NewRef(loop->id_views);
    }
    Py_ssize_t target = pick(loop, index, instances);
    return target < 0 ? -1 : place(loop, index, (int)target);
}

/* _dispatch_queued (late binding): queued requests, in order, to instances holding fewer than
 * `capacity` requests, while there are any. */
static int dispatch_queued(Loop *loop) {
    while (loop->cluster_queue.size) {
        Py_ssize_t num_free = 0;
        for (Py_ssize_t i = 0; i < loop->num_replicas; i++) {
            const Replica *rep = &loop->replicas[i];
            if (rep->num_resident + rep->waiting.size < loop->capacity) num_free++;
        }
        if (!num_free) return 0;
        PyObject *instances = PyTuple_New(num_free);
        for (Py_ssize_t i = 0, k = 0; instances != NULL && i < loop->num_replicas; i++) {
            const Replica *rep = &loop->replicas[i];
            if (rep->num_resident + rep->waiting.size >= loop->capacity) continue;
            PyObject *view = instance_view(loop, (int)i);
            if (view == NULL) Py_CLEAR(instances);
            else PyTuple_SET_ITEM(instances, k++, view);
        }
        int index = deque_popleft(&loop->cluster_queue);
        Py_ssize_t target = pick(loop, index, instances);
        if (target < 0 || place(loop, index, (int)target) < 0) return -1;
    }
    return 0;
}

/* _on_arrival */
static int on_arrival(Loop *loop, int index) {
    if (loop->late_binding) {
        if (deque_append(&loop->cluster_queue, index) < 0 || dispatch_queued(loop) < 0) return -1;
    } else if (route(loop, index) < 0) {
        return -1;
    }
    if (index + 1 < loop->num_requests)
        return push_event(loop, loop->requests[index + 1].arrived_at + loop->overhead_s, ARRIVAL, index + 1, 0, 0);
    return 0;
}

static int report_completed(Loop *loop, const Replica *rep);

/* _on_stage_end (one stage) */
static int on_stage_end(Loop *loop, const Event *event) {
    Replica *rep = &loop->replicas[event->target];
    if (event->serial != rep->batch.serial || event->version != rep->batch.version || !rep->batch_running)
        return 0; /* superseded: the run was cut and has a newer end event */
    if (finish_batch(rep, loop->requests, loop->now) < 0) return -1;
    Py_ssize_t done = rep->completed.size;
    if (done && loop->on_progress != Py_None) {
        loop->completed += done;
        if (loop->completed % loop->progress_every < done) {
            PyObject *result = PyObject_CallFunction(loop->on_progress, "L", loop->completed);
            if (result == NULL) return -1;
            Py_DECREF(result);
        }
    }
    if (done && loop->reports != NULL && report_completed(loop, rep) < 0) return -1;
    if (done && loop->cluster_queue.size && dispatch_queued(loop) < 0) return -1; /* slots just freed */
    return schedule(loop, event->target);
}

static int run_loop(Loop *loop, double until) {
    while (loop->heap_size && loop->heap[0].time < until) {
        Event event = pop_event(loop);
        loop->now = event.time;
        loop->num_events += 1;
        int status;
        if (event.phase == ARRIVAL)
            status = on_arrival(loop, event.target);
        else if (event.phase == STAGE_END)
            status = on_stage_end(loop, &event);
        else
            status = schedule(loop, event.target);
        if (status < 0) return -1;
        if (!(loop->num_events & 0xFFF) && PyErr_CheckSignals() < 0) return -1; /* Ctrl-C on long runs */
    }
    return 0;
}

/* -- reading the cluster in and the results out ------------------------------------------------- */

static int get_double(PyObject *object, const char *name, double *out) {
    PyObject *value = PyObject_GetAttrString(object, name);
    if (value == NULL) return -1;
    *out = value == Py_None ? NAN : PyFloat_AsDouble(value);
    Py_DECREF(value);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int get_long(PyObject *object, const char *name, long long *out) {
    PyObject *value = PyObject_GetAttrString(object, name);
    if (value == NULL) return -1;
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int read_request(PyObject *object, Request *r) {
    long long prefill_done, replica_id;
    if (get_double(object, "arrived_at", &r->arrived_at) < 0 || get_long(object, "id", &r->id) < 0 ||
        get_long(object, "prompt_tokens", &r->prompt_tokens) < 0 ||
        get_long(object, "output_tokens", &r->output_tokens) < 0 ||
        get_long(object, "num_prefill", &r->num_prefill) < 0 || get_long(object, "num_decode", &r->num_decode) < 0 ||
        get_long(object, "processed", &r->processed) < 0 || get_long(object, "blocks", &r->blocks) < 0 ||
        get_long(object, "num_restarts", &r->num_restarts) < 0 ||
        get_long(object, "prefill_done", &prefill_done) < 0 || get_long(object, "replica_id", &replica_id) < 0 ||
        get_double(object, "scheduled_at", &r->scheduled_at) < 0 ||
        get_double(object, "prefill_completed_at", &r->prefill_completed_at) < 0 ||
        get_double(object, "completed_at", &r->completed_at) < 0)
        return -1;
    r->prefill_done = (int)prefill_done;
    r->replica_id = (int)replica_id;
    r->decode_base = 0;
    r->cohort_slot = -1;
    PyObject *key = PyObject_GetAttrString(object, "prefix_key");
    if (key == NULL) return -1;
    r->prefix_key = key;
    return 0;
}

static int set_time(PyObject *object, const char *name, double value) {
    PyObject *boxed = isnan(value) ? Py_NewRef(Py_None) : PyFloat_FromDouble(value);
    if (boxed == NULL) return -1;
    int status = PyObject_SetAttrString(object, name, boxed);
    Py_DECREF(boxed);
    return status;
}

static int set_long(PyObject *object, const char *name, long long value) {
    PyObject *boxed = PyLong_FromLongLong(value);
    if (boxed == NULL) return -1;
    int status = PyObject_SetAttrString(object, name, boxed);
    Py_DECREF(boxed);
    return status;
}

/* Every request's fields back onto its SimRequest (cohort members materialised). */
static int write_request(PyObject *object, Request *r, Replica *replicas) {
    if (r->cohort_slot >= 0) cohort_materialise(&replicas[r->replica_id].cohort, r);
    return set_time(object, "scheduled_at", r->scheduled_at) < 0 ||
                   set_time(object, "prefill_completed_at", r->prefill_completed_at) < 0 ||
                   set_time(object, "completed_at", r->completed_at) < 0 ||
                   set_long(object, "replica_id", r->replica_id) < 0 ||
                   set_long(object, "num_prefill", r->num_prefill) < 0 ||
                   set_long(object, "num_decode", r->num_decode) < 0 ||
                   set_long(object, "processed", r->processed) < 0 || set_long(object, "blocks", r->blocks) < 0 ||
                   set_long(object, "decode_base", r->decode_base) < 0 ||
                   set_long(object, "num_restarts", r->num_restarts) < 0 ||
                   PyObject_SetAttrString(object, "prefill_done", r->prefill_done ? Py_True : Py_False) < 0
               ? -1
               : 0;
}

static int read_replica(PyObject *spec, Replica *rep) {
    PyObject *timer = PyObject_GetAttrString(spec, "timer");
    if (timer == NULL) return -1;
    if (!PyObject_TypeCheck(timer, timing->timer_type)) {
        Py_DECREF(timer);
        PyErr_SetString(PyExc_TypeError, "a replica's timer must be a compiled StageTimer");
        return -1;
    }
    rep->timer = timer; /* owned */
    long long policy, fast_forward;
    if (get_long(spec, "policy", &policy) < 0 || get_long(spec, "fast_forward", &fast_forward) < 0 ||
        get_long(spec, "num_blocks", &rep->num_blocks) < 0 || get_long(spec, "block_size", &rep->block_size) < 0 ||
        get_long(spec, "batch_size_cap", &rep->batch_size_cap) < 0 ||
        get_long(spec, "max_micro_batch_size", &rep->max_micro_batch_size) < 0 ||
        get_long(spec, "watermark_blocks", &rep->watermark_blocks) < 0 ||
        get_long(spec, "chunk_size", &rep->chunk_size) < 0 ||
        get_long(spec, "max_tokens_in_batch", &rep->max_tokens_in_batch) < 0 ||
        get_double(spec, "idle_wakeup_s", &rep->idle_wakeup_s) < 0 ||
        get_double(spec, "idle_wakeup_ramp_s", &rep->idle_wakeup_ramp_s) < 0 ||
        get_double(spec, "admission_s", &rep->admission_s) < 0 || get_double(spec, "smoothing", &rep->smoothing) < 0 ||
        get_long(spec, "flops_per_token", &rep->flops_per_token) < 0 ||
        get_long(spec, "attention_flops_per_pair", &rep->attention_flops_per_pair) < 0)
        return -1;
    rep->policy = (int)policy;
    rep->fast_forward = (int)fast_forward;
    if (rep->block_size < 1 || rep->num_blocks < 1) {
        PyErr_SetString(PyExc_ValueError, "a replica needs blocks");
        return -1;
    }
    rep->kind = PyObject_GetAttrString(spec, "kind"); /* owned */
    if (rep->kind == NULL) return -1;
    rep->cohort.block_size = rep->block_size;
    rep->cohort.phase_counts = PyMem_Calloc(rep->block_size, sizeof(long long));
    if (rep->cohort.phase_counts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    rep->idle_since = -INFINITY;
    rep->batches = PyList_New(0);
    rep->kv_samples = PyList_New(0);
    return rep->batches == NULL || rep->kv_samples == NULL ? -1 : 0;
}

static void free_loop(Loop *loop) {
    for (Py_ssize_t i = 0; loop->replicas != NULL && i < loop->num_replicas; i++) {
        Replica *rep = &loop->replicas[i];
        Py_XDECREF(rep->timer);
        Py_XDECREF(rep->kind);
        Py_XDECREF(rep->batches);
        Py_XDECREF(rep->kv_samples);
        PyMem_Free(rep->waiting.items);
        PyMem_Free(rep->running.items);
        PyMem_Free(rep->prefilling.items);
        PyMem_Free(rep->skipped.items);
        PyMem_Free(rep->completed.items);
        PyMem_Free(rep->cohort.phase_counts);
        PyMem_Free(rep->cohort.members.items);
        PyMem_Free(rep->cohort.heap);
        PyMem_Free(rep->prefills);
        PyMem_Free(rep->batch.requests.items);
        PyMem_Free(rep->batch.num_tokens.items);
        PyMem_Free(rep->batch.pieces.items);
    }
    for (Py_ssize_t i = 0; loop->requests != NULL && i < loop->num_requests; i++)
        Py_XDECREF(loop->requests[i].prefix_key);
    PyMem_Free(loop->replicas);
    PyMem_Free(loop->requests);
    PyMem_Free(loop->heap);
    PyMem_Free(loop->cluster_queue.items);
    PyMem_Free(loop->live);
    Py_XDECREF(loop->zero);
}

/* A replica's totals, as ReplicaStats and the scheduler keep them. */
static PyObject *replica_result(const Replica *rep) {
    return Py_BuildValue("{s:d,s:d,s:L,s:L,s:O,s:O,s:d,s:d,s:L,s:L,s:L,s:L,s:L}", "busy_s", rep->busy_s, "flops",
                         rep->flops, "num_iterations", rep->num_iterations, "decode_tokens", rep->decode_tokens,
                         "batches", rep->batches, "kv_samples",
                         rep->kv_samples, "tokens_per_s", rep->tokens_per_s, "idle_since", rep->idle_since,
                         "num_preemptions", rep->num_preemptions, "num_allocated_blocks", rep->num_allocated_blocks,
                         "num_resident", rep->num_resident, "waiting_tokens", rep->waiting_tokens,
                         "resident_remaining_tokens", rep->resident_remaining_tokens);
}

static PyObject *loop_run(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"requests", "replicas", "pick", "reads_load", "id_views", "types", "overhead_s",
                               "start", "until", "on_progress", "progress_every", "late_binding", "capacity", NULL};
    PyObject *request_list, *replica_specs, *types;
    Loop loop = {0};
    double until;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!OpO!O!dddOLpL", keywords, &PyList_Type, &request_list,
                                     &PyList_Type, &replica_specs, &loop.pick, &loop.reads_load, &PyTuple_Type,
                                     &loop.id_views, &PyTuple_Type, &types, &loop.overhead_s, &loop.now, &until,
                                     &loop.on_progress, &loop.progress_every, &loop.late_binding, &loop.capacity))
        return NULL;
    if (!PyArg_ParseTuple(types, "OOO;types: (RouteRequest, InstanceView, ClusterView)", &loop.route_type,
                          &loop.instance_view_type, &loop.cluster_view_type))
        return NULL;
    if (loop.progress_every < 1) loop.progress_every = 1;
    PyObject *result = NULL;
    loop.zero = PyLong_FromLong(0);
    loop.num_requests = PyList_GET_SIZE(request_list);
    loop.num_replicas = PyList_GET_SIZE(replica_specs);
    loop.requests = PyMem_Calloc(loop.num_requests ? loop.num_requests : 1, sizeof(Request));
    loop.replicas = PyMem_Calloc(loop.num_replicas ? loop.num_replicas : 1, sizeof(Replica));
    if (loop.zero == NULL || loop.requests == NULL || loop.replicas == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (loop.num_replicas == 0) {
        PyErr_SetString(PyExc_ValueError, "no replicas");
        goto done;
    }
    for (Py_ssize_t i = 0; i < loop.num_requests; i++)
        if (read_request(PyList_GET_ITEM(request_list, i), &loop.requests[i]) < 0) goto done;
    for (Py_ssize_t i = 0; i < loop.num_replicas; i++)
        if (read_replica(PyList_GET_ITEM(replica_specs, i), &loop.replicas[i]) < 0) goto done;
    if (loop.num_requests &&
        push_event(&loop, loop.requests[0].arrived_at + loop.overhead_s, ARRIVAL, 0, 0, 0) < 0)
        goto done;
    if (run_loop(&loop, until) < 0) goto done;
    for (Py_ssize_t i = 0; i < loop.num_requests; i++)
        if (write_request(PyList_GET_ITEM(request_list, i), &loop.requests[i], loop.replicas) < 0) goto done;
    PyObject *replicas = PyList_New(loop.num_replicas);
    for (Py_ssize_t i = 0; replicas != NULL && i < loop.num_replicas; i++) {
        PyObject *totals = replica_result(&loop.replicas[i]);
        if (totals == NULL) Py_CLEAR(replicas);
        else PyList_SET_ITEM(replicas, i, totals);
    }
    PyObject *queued = replicas == NULL ? NULL : PyList_New(loop.cluster_queue.size);
    for (Py_ssize_t i = 0; queued != NULL && i < loop.cluster_queue.size; i++) {
        int index = loop.cluster_queue.items[(loop.cluster_queue.head + i) % loop.cluster_queue.capacity];
        PyList_SET_ITEM(queued, i, Py_NewRef(PyList_GET_ITEM(request_list, index)));
    }
    if (queued == NULL) Py_CLEAR(replicas);
    if (replicas != NULL) result = Py_BuildValue("(dLNN)", loop.now, loop.num_events, replicas, queued);
done:
    free_loop(&loop);
    return result;
}

/* -- a cluster that lives between calls: rollflow.sim._loop.Cluster ----------------------------
 *
 * The same replicas, batches and events as the closed loop above, for a simulator that composes
 * the serving cluster and acts between its events (rollflow/sim/compiled_cluster.py: the RL
 * step's rollout). Requests are submitted one at a time (each gets a new slot; a request handed
 * back and resumed elsewhere gets another), instances are added, stop taking work and retire
 * while the cluster runs, and `run(limit)` applies the serving events up to `limit`. What the
 * caller must hear of comes back from `run` as reports, in the order the Python loop would have
 * called its hooks: (0, replica, time, [completed requests]) after a batch, (1, replica, time,
 * [unfinished requests, by id]) when a retiring instance stops. A report ends the run at its
 * time (the caller's own events at that time come after the serving ones). Each reported
 * request has been written back onto its SimRequest; `write_back` writes the others. */

typedef struct {
    PyObject_HEAD
    Loop loop;
    Py_ssize_t requests_capacity, replicas_capacity;
} Cluster;

enum { LOAD_QUEUED = 1, LOAD_OUTSTANDING = 2, LOAD_TOKENS = 3 }; /* the argmin routers' loads */

static int report(Loop *loop, int kind, int replica_id, const IntVec *indices) {
    PyObject *requests = PyList_New(indices->size);
    if (requests == NULL) return -1;
    for (Py_ssize_t i = 0; i < indices->size; i++) {
        int index = indices->items[i];
        PyObject *object = PyList_GET_ITEM(loop->request_objects, index);
        if (write_request(object, &loop->requests[index], loop->replicas) < 0) {
            Py_DECREF(requests);
            return -1;
        }
        PyList_SET_ITEM(requests, i, Py_NewRef(object));
    }
    PyObject *entry = Py_BuildValue("(iidN)", kind, replica_id, loop->now, requests);
    if (entry == NULL) return -1;
    int status = PyList_Append(loop->reports, entry);
    Py_DECREF(entry);
    return status;
}

static int report_completed(Loop *loop, const Replica *rep) {
    for (Py_ssize_t i = 0; i < rep->completed.size; i++) loop->live[rep->completed.items[i]] = 0;
    return report(loop, 0, (int)(rep - loop->replicas), &rep->completed);
}

static const Request *sort_requests_by_id;

static int by_id_then_slot(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    long long i = sort_requests_by_id[x].id, j = sort_requests_by_id[y].id;
    if (i != j) return i < j ? -1 : 1;
    return (x > y) - (x < y); /* slots grow with submission: a stable sort */
}

/* ServingSimulator._stop: ReplicaScheduler.release_all, then the unfinished requests by id. */
static int stop_replica(Loop *loop, int replica_id) {
    Replica *rep = &loop->replicas[replica_id];
    Request *requests = loop->requests;
    IntVec released = {0};
    int status = -1;
    while (rep->waiting.size)
        if (intvec_push(&released, deque_popleft(&rep->waiting)) < 0) goto done;
    rep->waiting_tokens = 0;
    Py_ssize_t num_waiting = released.size;
    for (Py_ssize_t i = 0; i < rep->running.size; i++)
        if (intvec_push(&released, rep->running.items[i]) < 0) goto done;
    rep->running.size = 0;
    if (cohort_release_all(&rep->cohort, requests, &released) < 0) goto done;
    for (Py_ssize_t i = num_waiting; i < released.size; i++) free_request(rep, &requests[released.items[i]]);
    sort_requests_by_id = requests;
    qsort(released.items, released.size, sizeof(int), by_id_then_slot);
    for (Py_ssize_t i = 0; i < released.size; i++) loop->live[released.items[i]] = 0;
    rep->retiring = 0;
    rep->retired = 1;
    status = report(loop, 1, replica_id, &released);
done:
    PyMem_Free(released.items);
    return status;
}

/* The argmin routers (routing.py's _ArgminRouter): the lowest (load, id) among the instances
 * taking work, or only the remote ones. */
static Py_ssize_t argmin_pick(Loop *loop, int load_kind, int remote_only) {
    Py_ssize_t best = -1;
    long long best_load = 0;
    for (Py_ssize_t i = 0; i < loop->num_replicas; i++) {
        Replica *rep = &loop->replicas[i];
        if (!rep->accepting || (remote_only && rep->is_local)) continue;
        long long load;
        if (load_kind == LOAD_QUEUED) {
            load = rep->waiting.size;
        } else if (load_kind == LOAD_OUTSTANDING) {
            load = rep->num_resident + rep->waiting.size;
        } else {
            load = rep->waiting_tokens + rep->resident_remaining_tokens;
            if (rep->run_in_flight) load -= iterations_done(&rep->batch, loop->now) * rep->batch.tokens_per_iteration;
        }
        if (best < 0 || load < best_load) {
            best = i;
            best_load = load;
        }
    }
    if (best < 0) PyErr_SetString(PyExc_ValueError, "no instance to route to: none takes work");
    return best;
}

static Replica *cluster_replica(Cluster *self, Py_ssize_t replica_id) {
    if (replica_id < 0 || replica_id >= self->loop.num_replicas) {
        PyErr_Format(PyExc_IndexError, "no instance %zd", replica_id);
        return NULL;
    }
    return &self->loop.replicas[replica_id];
}

/* The instance a method's one argument names, its id in `*replica_id`; NULL with an error set. */
static Replica *arg_replica(Cluster *self, PyObject *arg, Py_ssize_t *replica_id) {
    *replica_id = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (*replica_id == -1 && PyErr_Occurred()) return NULL;
    return cluster_replica(self, *replica_id);
}

static int cluster_init(Cluster *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"instance_view_type", "start", NULL};
    Loop *loop = &self->loop;
    if (loop->reports != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Cluster is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Od", keywords, &loop->instance_view_type, &loop->now))
        return -1;
    Py_INCREF(loop->instance_view_type);
    loop->zero = PyLong_FromLong(0);
    loop->request_objects = PyList_New(0);
    loop->reports = PyList_New(0);
    loop->on_progress = Py_None;
    loop->progress_every = 1;
    return loop->zero == NULL || loop->request_objects == NULL || loop->reports == NULL ? -1 : 0;
}

static void cluster_dealloc(Cluster *self) {
    Py_XDECREF(self->loop.instance_view_type);
    Py_XDECREF(self->loop.request_objects);
    Py_XDECREF(self->loop.reports);
    free_loop(&self->loop);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* add_replica(spec, batches, kv_samples) -> id: a new instance, empty, taking work; its batch
 * rows and KV samples go to the two lists given (its ReplicaStats'). */
static PyObject *cluster_add_replica(Cluster *self, PyObject *args) {
    PyObject *spec, *batches, *kv_samples;
    if (!PyArg_ParseTuple(args, "OO!O!", &spec, &PyList_Type, &batches, &PyList_Type, &kv_samples)) return NULL;
    Loop *loop = &self->loop;
    if (loop->num_replicas == self->replicas_capacity) {
        Py_ssize_t capacity = self->replicas_capacity ? 2 * self->replicas_capacity : 16;
        Replica *replicas = resize_array(loop->replicas, sizeof(Replica), capacity, &self->replicas_capacity);
        if (replicas == NULL) return NULL;
        loop->replicas = replicas;
    }
    Replica *rep = &loop->replicas[loop->num_replicas];
    memset(rep, 0, sizeof(Replica));
    loop->num_replicas += 1; /* free_loop releases what read_replica took, even if it fails */
    if (read_replica(spec, rep) < 0) return NULL;
    Py_SETREF(rep->batches, Py_NewRef(batches));
    Py_SETREF(rep->kv_samples, Py_NewRef(kv_samples));
    rep->accepting = 1;
    rep->is_local = PyUnicode_Check(rep->kind) && PyUnicode_CompareWithASCIIString(rep->kind, "local") == 0;
    return PyLong_FromSsize_t(loop->num_replicas - 1);
}

/* submit(request, target, load, remote_only) -> target: place `request` (its fields read now) on
 * `target`, or with target -1 on the argmin router's pick for `load` (LOAD_*). */
static PyObject *cluster_submit(Cluster *self, PyObject *args) {
    PyObject *object;
    Py_ssize_t target;
    int load_kind, remote_only;
    if (!PyArg_ParseTuple(args, "Onip", &object, &target, &load_kind, &remote_only)) return NULL;
    Loop *loop = &self->loop;
    if (target < 0) {
        target = argmin_pick(loop, load_kind, remote_only);
        if (target < 0) return NULL;
    } else if (cluster_replica(self, target) == NULL) {
        return NULL;
    }
    if (loop->num_requests == self->requests_capacity) {
        Py_ssize_t capacity = self->requests_capacity ? 2 * self->requests_capacity : 1024;
        Request *requests = PyMem_Realloc(loop->requests, sizeof(Request) * capacity);
        char *live = PyMem_Realloc(self->loop.live, capacity);
        if (requests != NULL) loop->requests = requests;
        if (live != NULL) self->loop.live = live;
        if (requests == NULL || live == NULL) return PyErr_NoMemory();
        self->requests_capacity = capacity;
    }
    int index = (int)loop->num_requests;
    Request *r = &loop->requests[index];
    memset(r, 0, sizeof(Request));
    if (read_request(object, r) < 0) {
        Py_CLEAR(r->prefix_key);
        return NULL;
    }
    if (PyList_Append(loop->request_objects, object) < 0) {
        Py_CLEAR(r->prefix_key);
        return NULL;
    }
    loop->num_requests += 1;
    self->loop.live[index] = 1;
    if (place(loop, index, (int)target) < 0) return NULL;
    return PyLong_FromSsize_t(target);
}

/* run(limit) -> [reports]: apply the serving events at or before `limit`, up to the first report's time. */
static PyObject *cluster_run(Cluster *self, PyObject *arg) {
    double limit = PyFloat_AsDouble(arg);
    if (limit == -1.0 && PyErr_Occurred()) return NULL;
    Loop *loop = &self->loop;
    while (loop->heap_size && loop->heap[0].time <= limit) {
        Event event = pop_event(loop);
        loop->now = event.time;
        loop->num_events += 1;
        int status = event.phase == STAGE_END ? on_stage_end(loop, &event) : schedule(loop, event.target);
        if (status < 0) return NULL;
        if (PyList_GET_SIZE(loop->reports)) limit = loop->now;
        if (!(loop->num_events & 0xFFF) && PyErr_CheckSignals() < 0) return NULL;
    }
    PyObject *reports = loop->reports;
    loop->reports = PyList_New(0);
    if (loop->reports == NULL) {
        loop->reports = reports;
        return NULL;
    }
    return reports;
}

/* retire(id) -> the unfinished requests if the instance stopped now, else None (it stops at the
 * end of its batch in flight, cut at the first iteration boundary from now: a report of `run`). */
static PyObject *cluster_retire(Cluster *self, PyObject *arg) {
    Py_ssize_t replica_id;
    Replica *rep = arg_replica(self, arg, &replica_id);
    if (rep == NULL) return NULL;
    Loop *loop = &self->loop;
    rep->accepting = 0;
    rep->retiring = 1;
    if (cut_run_in_flight(loop, (int)replica_id) < 0) return NULL;
    if (rep->batch_running) Py_RETURN_NONE;
    if (stop_replica(loop, (int)replica_id) < 0) return NULL;
    Py_ssize_t last = PyList_GET_SIZE(loop->reports) - 1;
    PyObject *requests = Py_NewRef(PyTuple_GET_ITEM(PyList_GET_ITEM(loop->reports, last), 3));
    if (PyList_SetSlice(loop->reports, last, last + 1, NULL) < 0) {
        Py_DECREF(requests);
        return NULL;
    }
    return requests;
}

static PyObject *cluster_stop_accepting(Cluster *self, PyObject *arg) {
    Py_ssize_t replica_id;
    Replica *rep = arg_replica(self, arg, &replica_id);
    if (rep == NULL) return NULL;
    rep->accepting = 0;
    Py_RETURN_NONE;
}

/* view(id) -> InstanceView now (Replica.view). */
static PyObject *cluster_view(Cluster *self, PyObject *arg) {
    Py_ssize_t replica_id;
    if (arg_replica(self, arg, &replica_id) == NULL) return NULL;
    return instance_view(&self->loop, (int)replica_id);
}

/* num_outstanding() -> per instance, the requests on it, running or queued (InstanceView.num_outstanding). */
static PyObject *cluster_num_outstanding(Cluster *self, PyObject *Py_UNUSED(ignored)) {
    Loop *loop = &self->loop;
    PyObject *counts = PyList_New(loop->num_replicas);
    for (Py_ssize_t i = 0; counts != NULL && i < loop->num_replicas; i++) {
        const Replica *rep = &loop->replicas[i];
        PyObject *count = PyLong_FromLongLong(rep->num_resident + (long long)rep->waiting.size);
        if (count == NULL) Py_CLEAR(counts);
        else PyList_SET_ITEM(counts, i, count);
    }
    return counts;
}

/* totals(id) -> the replica's totals, as the closed loop returns them (compiled._write_back). */
static PyObject *cluster_totals(Cluster *self, PyObject *arg) {
    Py_ssize_t replica_id;
    Replica *rep = arg_replica(self, arg, &replica_id);
    return rep == NULL ? NULL : replica_result(rep);
}

/* write_back(): the requests still on an instance, written back onto their SimRequests as they are now. */
static PyObject *cluster_write_back(Cluster *self, PyObject *Py_UNUSED(ignored)) {
    Loop *loop = &self->loop;
    for (Py_ssize_t i = 0; i < loop->num_requests; i++)
        if (self->loop.live[i] &&
            write_request(PyList_GET_ITEM(loop->request_objects, i), &loop->requests[i], loop->replicas) < 0)
            return NULL;
    Py_RETURN_NONE;
}

static PyObject *cluster_get_now(Cluster *self, void *closure) { return PyFloat_FromDouble(self->loop.now); }

static int cluster_set_now(Cluster *self, PyObject *value, void *closure) {
    double now = value == NULL ? -1.0 : PyFloat_AsDouble(value);
    if (value == NULL) PyErr_SetString(PyExc_AttributeError, "now cannot be deleted");
    if (now == -1.0 && PyErr_Occurred()) return -1;
    self->loop.now = now;
    return 0;
}

static PyObject *cluster_get_num_events(Cluster *self, void *closure) {
    return PyLong_FromLongLong(self->loop.num_events);
}

static PyObject *cluster_get_decode_tokens(Cluster *self, void *closure) {
    long long total = 0;
    for (Py_ssize_t i = 0; i < self->loop.num_replicas; i++) total += self->loop.replicas[i].decode_tokens;
    return PyLong_FromLongLong(total);
}

static PyObject *cluster_get_num_pending(Cluster *self, void *closure) {
    return PyLong_FromSsize_t(self->loop.heap_size);
}

static PyObject *cluster_get_next_time(Cluster *self, void *closure) {
    return PyFloat_FromDouble(self->loop.heap_size ? self->loop.heap[0].time : INFINITY);
}

static PyGetSetDef cluster_getset[] = {
    {"now", (getter)cluster_get_now, (setter)cluster_set_now, "the simulated clock", NULL},
    {"num_events", (getter)cluster_get_num_events, NULL, "serving events applied so far", NULL},
    {"num_pending", (getter)cluster_get_num_pending, NULL, "serving events queued", NULL},
    {"decode_tokens", (getter)cluster_get_decode_tokens, NULL,
     "tokens sampled by the decode iterations of every batch ended so far, on every replica", NULL},
    {"next_time", (getter)cluster_get_next_time, NULL, "the earliest queued serving event's time (inf: none)",
     NULL},
    {NULL},
};

static PyMethodDef cluster_methods[] = {
    {"add_replica", (PyCFunction)cluster_add_replica, METH_VARARGS, "add_replica(spec, batches, kv_samples) -> id"},
    {"submit", (PyCFunction)cluster_submit, METH_VARARGS,
     "submit(request, target, load, remote_only) -> target (-1: the argmin router's pick)"},
    {"run", (PyCFunction)cluster_run, METH_O, "run(limit) -> [(kind, replica, time, [requests])]"},
    {"retire", (PyCFunction)cluster_retire, METH_O, "retire(id) -> [unfinished requests] or None"},
    {"stop_accepting", (PyCFunction)cluster_stop_accepting, METH_O, "stop_accepting(id)"},
    {"view", (PyCFunction)cluster_view, METH_O, "view(id) -> InstanceView"},
    {"num_outstanding", (PyCFunction)cluster_num_outstanding, METH_NOARGS, "num_outstanding() -> [per instance]"},
    {"totals", (PyCFunction)cluster_totals, METH_O, "totals(id) -> dict"},
    {"write_back", (PyCFunction)cluster_write_back, METH_NOARGS, "write_back()"},
    {NULL},
};

static PyTypeObject ClusterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rollflow.sim._loop.Cluster",
    .tp_doc = "A serving cluster in C that lives between calls (rollflow/sim/compiled_cluster.py drives it).",
    .tp_basicsize = sizeof(Cluster),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)cluster_init,
    .tp_dealloc = (destructor)cluster_dealloc,
    .tp_methods = cluster_methods,
    .tp_getset = cluster_getset,
};

static PyMethodDef loop_methods[] = {
    {"run", (PyCFunction)(void (*)(void))loop_run, METH_VARARGS | METH_KEYWORDS,
     "run(requests, replicas, pick, reads_load, id_views, types, overhead_s, start, until, on_progress, "
     "progress_every, late_binding, capacity) -> (now, num_events, [replica totals], [requests still queued]); "
     "see rollflow/sim/compiled.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef loop_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rollflow.sim._loop",
    .m_doc = "The serving simulator's loop in C (rollflow.sim.simulator is the reference).",
    .m_size = -1,
    .m_methods = loop_methods,
};

PyMODINIT_FUNC PyInit__loop(void) {
    PyObject *timing_module = PyImport_ImportModule("rollflow.perf._timing"); /* the capsule's home */
    if (timing_module == NULL) return NULL;
    Py_DECREF(timing_module);
    timing = PyCapsule_Import(ROLLFLOW_TIMING_CAPSULE, 0);
    if (timing == NULL || PyType_Ready(&ClusterType) < 0) return NULL;
    PyObject *module = PyModule_Create(&loop_module);
    if (module != NULL && PyModule_AddObjectRef(module, "Cluster", (PyObject *)&ClusterType) < 0) Py_CLEAR(module);
    return module;
}
