/* drainpipe.native._groupstates: an event batch's group ids and per-group metric states, a pass over the rows each.
 *
 * Why C: aggregating a batch (aggregate.py) was numpy over dense group ids, a dozen whole-array passes and
 * temporaries per metric (codes multiplied and added, a lookup table, masks and their selections, bin codes, one
 * bincount per category), ~120 ns an event for the default metric set: the largest share of a worker's CPU for every
 * input format. Each function below does one of those steps in one pass, with the same arithmetic in the same row
 * order, so that its results are bit for bit the numpy path's (aggregate.py keeps that path: Spark executors have no
 * C extensions, and a property test holds both to one result).
 *
 * Arrays come in and go out as buffers of rows (C-contiguous numpy arrays; bytearrays out): codes int32, ts and
 * group ids int64, values and weights float64, status one byte per row (numpy bool).
 *
 * groups(services, subs, excluded, ts, width_ms) -> (gid, first)
 *   Dense group ids of the rows' (service code, sub code, time slot) keys, slot = floor(ts / width_ms); subs None
 *   for the service scope (every row's sub code 0). Rows whose sub code is `excluded` (the empty string's code, or -1
 *   for none) belong to no group: id -1. Ids follow the keys' order (service, then sub, then slot), as the numpy
 *   path's do: by a table over the keys' ranges where that is small (as numpy's dense limit), else by hashing and
 *   sorting the distinct keys. gid: int64 per row; first: int64 per group, a row of it.
 *
 * states(function, gid, size, values, status, weights, threshold) -> (n, ...)
 *   Per group id in [0, size) over the rows with gid >= 0 (a metric's filter is folded into its ids as -1): n, the
 *   number of requests (weights None: every row is one; else the sum of the rows' weights, truncated to int64 as
 *   numpy's astype does), then by function: COUNT nothing more; SUM v (float64: the sum of values, times the
 *   weight); MIN, MAX v (float64, +inf / -inf for a group without rows; as numpy's minimum/maximum: NaN propagates,
 *   a tie takes the later row); SLA ok (int64: requests with status set); APDEX ok, tol (int64: status set and value
 *   <= threshold; status set and threshold < value <= 4 * threshold).
 *
 * histogram(gid, size, values, weights, precision) -> (group, bin, n) | None
 *   The rows as above counted per (group, bin), bin = floor(value / precision) (at most 2^53), for the pairs that
 *   occur, in (group, bin) order; n int64 as in states. By a dense table of groups x bins cells where that is at
 *   most max(2^16, 4 x rows) cells, else group by group (a row of bin counters reused). None when a value is NaN,
 *   or the bins alone span more than that many (the caller's numpy path answers then).
 *
 * Errors: TypeError for the wrong number of arguments, ValueError for arrays of the wrong size, a negative code or an
 * id at or above size, MemoryError. Each call holds the GIL throughout and keeps no state between calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { COUNT, SUM, MIN, MAX, SLA, APDEX };

/* ------------------------------------------------------------------------------------------------ buffers */

/* A borrowed view of a row array: `rows` items of `item` bytes (NULL data for None). */
typedef struct {
    Py_buffer view;
    const void *data;
    int held;
} Rows;

/* Get `obj` (None allowed when `optional`) as `rows` items of `item` bytes; 0, or -1 with an exception set. */
static int
rows_get(Rows *r, PyObject *obj, Py_ssize_t rows, Py_ssize_t item, int optional, const char *name)
{
    r->data = NULL;
    r->held = 0;
    if (obj == Py_None && optional)
        return 0;
    if (PyObject_GetBuffer(obj, &r->view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    r->held = 1;
    if (r->view.len != rows * item) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd bytes (%zd rows of %zd), got %zd", name, rows * item, rows,
                     item, r->view.len);
        return -1;
    }
    r->data = r->view.buf;
    return 0;
}

static void
rows_release(Rows *r)
{
    if (r->held)
        PyBuffer_Release(&r->view);
    r->held = 0;
}

/* A new bytearray of n bytes, its data in *out; NULL with an exception set. */
static PyObject *
new_array(Py_ssize_t n, void **out)
{
    PyObject *a = PyByteArray_FromStringAndSize(NULL, n);
    if (a != NULL)
        *out = PyByteArray_AS_STRING(a);
    return a;
}

/* ------------------------------------------------------------------------------------------------ groups */

typedef struct {
    int32_t service, sub;
    int64_t slot, first; /* first: a row of the group */
} Key;

static inline int
key_cmp(const Key *a, const Key *b)
{
    if (a->service != b->service)
        return a->service < b->service ? -1 : 1;
    if (a->sub != b->sub)
        return a->sub < b->sub ? -1 : 1;
    return a->slot < b->slot ? -1 : a->slot > b->slot;
}

static const Key *sort_keys; /* (qsort has no context argument; the GIL serializes the callers) */

static int
by_key(const void *a, const void *b)
{
    return key_cmp(&sort_keys[*(const int64_t *)a], &sort_keys[*(const int64_t *)b]);
}

static inline uint64_t
key_hash(int32_t service, int32_t sub, int64_t slot)
{
    uint64_t h = ((uint64_t)(uint32_t)service << 32 | (uint32_t)sub) * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)slot * 0xC2B2AE3D27D4EB4Full;
    return h ^ (h >> 29);
}

static inline int64_t
floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* The slot of ts: floor(ts / width), remembered for the next row (a division costs more than the rest of a row, and
 * a batch's rows are mostly in time order, so the next row is mostly in the same slot). */
typedef struct {
    int64_t width, start, end, slot; /* [start, end): the remembered slot's times */
} Slotter;

static inline int64_t
slot_of(Slotter *z, int64_t ts)
{
    if (ts < z->start || ts >= z->end) {
        z->slot = floor_div(ts, z->width);
        z->start = z->slot * z->width; /* (validated times are far from int64's ends) */
        z->end = z->start + z->width;
    }
    return z->slot;
}

/* groups by a dense table over the keys' ranges (gid holds each row's slot on entry): 1, or 0 if the table would
 * be too large, or -1 with an exception set */
static int
dense_groups(const int32_t *svc, const int32_t *sub, int64_t excluded, int64_t *gid, Py_ssize_t n, int64_t low,
             int64_t high, int64_t services, int64_t subs, PyObject **first_out)
{
    double limit = (double)(4 * n > 65536 ? 4 * n : 65536);
    double slots = (double)high - (double)low + 1;
    if (slots * (double)services * (double)subs > limit)
        return 0;
    int64_t width = high - low + 1, cells = (int64_t)(slots * (double)services * (double)subs);
    int64_t *table = PyMem_Calloc((size_t)(cells ? cells : 1), sizeof *table); /* row + 1, then id */
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (sub && sub[i] == excluded)
            continue;
        int64_t key = ((int64_t)svc[i] * subs + (sub ? sub[i] : 0)) * width + (gid[i] - low);
        table[key] = i + 1;
        gid[i] = key;
    }
    Py_ssize_t used = 0;
    for (int64_t key = 0; key < cells; key++)
        used += table[key] != 0;
    int64_t *first;
    if (!(*first_out = new_array(used * 8, (void **)&first))) {
        PyMem_Free(table);
        return -1;
    }
    for (int64_t key = 0, id = 0; key < cells; key++)
        if (table[key]) {
            first[id] = table[key] - 1;
            table[key] = id++;
        }
    for (Py_ssize_t i = 0; i < n; i++)
        gid[i] = (sub && sub[i] == excluded) ? -1 : table[gid[i]];
    PyMem_Free(table);
    return 1;
}

/* groups by a hash table (gid holds each row's slot on entry): 0, or -1 with an exception set */
static int
hashed_groups(const int32_t *svc, const int32_t *sub, int64_t excluded, int64_t *gid, Py_ssize_t n,
              PyObject **first_out)
{
    int status = -1;
    size_t cap = 1024, used = 0, key_cap = 256;
    int64_t *slots = PyMem_Calloc(cap, sizeof *slots); /* group id + 1 per slot, 0 empty */
    Key *keys = PyMem_Malloc(key_cap * sizeof *keys);
    int64_t *order = NULL, *remap = NULL;
    if (!slots || !keys)
        goto nomem;
    int64_t last = -1; /* the previous row's group: rows of one group often come together */
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t a = svc[i], b = sub ? sub[i] : 0;
        int64_t s = gid[i];
        if (sub && b == excluded) {
            gid[i] = -1;
            continue;
        }
        if (last >= 0 && keys[last].service == a && keys[last].sub == b && keys[last].slot == s) {
            gid[i] = last;
            continue;
        }
        size_t h = (size_t)key_hash(a, b, s) & (cap - 1);
        for (;;) {
            int64_t at = slots[h];
            if (at == 0) { /* a new group */
                if (used == key_cap) {
                    Key *grown = PyMem_Realloc(keys, 2 * key_cap * sizeof *keys);
                    if (!grown)
                        goto nomem;
                    keys = grown, key_cap *= 2;
                }
                keys[used] = (Key){a, b, s, i};
                slots[h] = (int64_t)++used;
                last = (int64_t)used - 1;
                if (2 * used > cap) { /* keep the table at most half full */
                    size_t grown_cap = 2 * cap;
                    int64_t *grown = PyMem_Calloc(grown_cap, sizeof *grown);
                    if (!grown)
                        goto nomem;
                    for (size_t k = 0; k < used; k++) {
                        size_t g = (size_t)key_hash(keys[k].service, keys[k].sub, keys[k].slot) & (grown_cap - 1);
                        while (grown[g])
                            g = (g + 1) & (grown_cap - 1);
                        grown[g] = (int64_t)k + 1;
                    }
                    PyMem_Free(slots);
                    slots = grown, cap = grown_cap;
                }
                break;
            }
            const Key *k = &keys[at - 1];
            if (k->service == a && k->sub == b && k->slot == s) {
                last = at - 1;
                break;
            }
            h = (h + 1) & (cap - 1);
        }
        gid[i] = last;
    }
    /* ids in key order, as the numpy path gives them */
    order = PyMem_Malloc((used ? used : 1) * sizeof *order);
    remap = PyMem_Malloc((used ? used : 1) * sizeof *remap);
    if (!order || !remap)
        goto nomem;
    for (size_t k = 0; k < used; k++)
        order[k] = (int64_t)k;
    sort_keys = keys;
    qsort(order, used, sizeof *order, by_key);
    for (size_t k = 0; k < used; k++)
        remap[order[k]] = (int64_t)k;
    for (Py_ssize_t i = 0; i < n; i++)
        if (gid[i] >= 0)
            gid[i] = remap[gid[i]];
    int64_t *first;
    if (!(*first_out = new_array((Py_ssize_t)used * 8, (void **)&first)))
        goto done;
    for (size_t k = 0; k < used; k++)
        first[k] = keys[order[k]].first;
    status = 0;
    goto done;
nomem:
    PyErr_NoMemory();
done:
    PyMem_Free(slots);
    PyMem_Free(keys);
    PyMem_Free(order);
    PyMem_Free(remap);
    return status;
}

static PyObject *
groups(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "groups(services, subs, excluded, ts, width_ms)");
        return NULL;
    }
    long long excluded = PyLong_AsLongLong(args[2]), width = PyLong_AsLongLong(args[4]);
    if ((excluded == -1 || width == -1) && PyErr_Occurred())
        return NULL;
    if (width <= 0) {
        PyErr_SetString(PyExc_ValueError, "groups: width_ms must be positive");
        return NULL;
    }
    Rows services, subs, ts;
    memset(&subs, 0, sizeof subs);
    memset(&ts, 0, sizeof ts);
    if (PyObject_GetBuffer(args[0], &services.view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    services.held = 1;
    services.data = services.view.buf;
    Py_ssize_t n = services.view.len / 4;
    PyObject *result = NULL, *gid_out = NULL, *first_out = NULL;
    if (services.view.len % 4) {
        PyErr_SetString(PyExc_ValueError, "groups: services must be int32 codes");
        goto done;
    }
    if (rows_get(&subs, args[1], n, 4, 1, "subs") < 0 || rows_get(&ts, args[3], n, 8, 0, "ts") < 0)
        goto done;
    const int32_t *svc = services.data, *sub = subs.data;
    const int64_t *t = ts.data;
    int64_t *gid;
    if (!(gid_out = new_array(n * 8, (void **)&gid)))
        goto done;
    /* each row's slot into gid, and the keys' ranges */
    Slotter z = {width, 1, 0, 0};
    int64_t low = INT64_MAX, high = INT64_MIN, services_max = -1, subs_max = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (svc[i] < 0 || (sub && sub[i] < 0 && sub[i] != excluded)) {
            PyErr_SetString(PyExc_ValueError, "groups: a negative code");
            goto done;
        }
        if (sub && sub[i] == excluded)
            continue;
        int64_t s = gid[i] = slot_of(&z, t[i]);
        low = s < low ? s : low;
        high = s > high ? s : high;
        services_max = svc[i] > services_max ? svc[i] : services_max;
        if (sub)
            subs_max = sub[i] > subs_max ? sub[i] : subs_max;
    }
    int dense;
    if (services_max < 0) { /* no row has a group */
        void *none;
        for (Py_ssize_t i = 0; i < n; i++)
            gid[i] = -1;
        if (!(first_out = new_array(0, &none)))
            goto done;
        dense = 1;
    }
    else
        dense = dense_groups(svc, sub, excluded, gid, n, low, high, services_max + 1, sub ? subs_max + 1 : 1,
                             &first_out);
    if (dense < 0 || (dense == 0 && hashed_groups(svc, sub, excluded, gid, n, &first_out) < 0))
        goto done;
    result = PyTuple_Pack(2, gid_out, first_out);
done:
    Py_XDECREF(gid_out);
    Py_XDECREF(first_out);
    rows_release(&services);
    rows_release(&subs);
    rows_release(&ts);
    return result;
}

/* ------------------------------------------------------------------------------------------------ states */

/* The common arguments of states and histogram. */
typedef struct {
    Rows gid, values, status, weights;
    Py_ssize_t n, size;
} Input;

static void
input_release(Input *in)
{
    rows_release(&in->gid);
    rows_release(&in->values);
    rows_release(&in->status);
    rows_release(&in->weights);
}

/* gid and size, then the row arrays (NULL objects: not taken); 0, or -1 with an exception set */
static int
input_get(Input *in, PyObject *gid, PyObject *size, PyObject *values, PyObject *status, PyObject *weights,
          int values_optional)
{
    memset(in, 0, sizeof *in);
    if (PyObject_GetBuffer(gid, &in->gid.view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    in->gid.held = 1;
    in->gid.data = in->gid.view.buf;
    if (in->gid.view.len % 8) {
        PyErr_SetString(PyExc_ValueError, "gid must be int64");
        return -1;
    }
    in->n = in->gid.view.len / 8;
    in->size = PyLong_AsSsize_t(size);
    if (in->size == -1 && PyErr_Occurred())
        return -1;
    if (in->size < 0) {
        PyErr_SetString(PyExc_ValueError, "size must not be negative");
        return -1;
    }
    if ((values && rows_get(&in->values, values, in->n, 8, values_optional, "values") < 0) ||
        (status && rows_get(&in->status, status, in->n, 1, 1, "status") < 0) ||
        rows_get(&in->weights, weights, in->n, 8, 1, "weights") < 0)
        return -1;
    return 0;
}

static int
id_error(void)
{
    PyErr_SetString(PyExc_ValueError, "a group id is not below size");
    return -1;
}

/* One loop over the counted rows for each function, with `one` a row's weight: an int64 1 into int64 counts, or
 * its float64 weight into float64 sums (truncated to int64 at the end, as numpy's bincount then astype(int64)).
 * A group's states are kept in registers (rn, rok, rtol, rv) while its rows follow each other, loaded from and
 * stored back to the arrays when the group changes: the same additions in the same order as adding each row into
 * the arrays, without a store and a load of the same counter per row (rows of one group mostly come in runs: a
 * batch is in time order, and a service's minute is a run). An id at or above size stops the loop. */
#define EACH_ROW(T, ONE, BODY)                                                                                      \
    do {                                                                                                            \
        int64_t cur = -1;                                                                                           \
        T rn = 0, rok = 0, rtol = 0;                                                                                \
        double rv = 0;                                                                                              \
        for (Py_ssize_t i = 0; i < in->n; i++) {                                                                    \
            int64_t g = gid[i];                                                                                     \
            if (g < 0)                                                                                              \
                continue;                                                                                           \
            if (g != cur) {                                                                                         \
                if (g >= size)                                                                                      \
                    return id_error();                                                                              \
                if (cur >= 0)                                                                                       \
                    STORE_RUN(cur);                                                                                 \
                cur = g;                                                                                            \
                rn = n[g], rok = ok ? ok[g] : 0, rtol = tol ? tol[g] : 0, rv = v ? v[g] : 0;                        \
            }                                                                                                       \
            T one = (ONE);                                                                                          \
            BODY                                                                                                    \
        }                                                                                                           \
        if (cur >= 0)                                                                                               \
            STORE_RUN(cur);                                                                                         \
    } while (0)

#define STORE_RUN(g)                                                                                                \
    do {                                                                                                            \
        n[g] = rn;                                                                                                  \
        if (ok)                                                                                                     \
            ok[g] = rok;                                                                                            \
        if (tol)                                                                                                    \
            tol[g] = rtol;                                                                                          \
        if (v)                                                                                                      \
            v[g] = rv;                                                                                              \
    } while (0)

#define FUNCTION_LOOPS(T, ONE, PICK)                                                                                \
    do {                                                                                                            \
        T *n = nt, *ok = okt, *tol = tolt;                                                                          \
        switch (function) {                                                                                         \
        case COUNT:                                                                                                 \
            EACH_ROW(T, ONE, rn += one;);                                                                           \
            break;                                                                                                  \
        case SUM:                                                                                                   \
            EACH_ROW(T, ONE, rn += one; rv += w ? values[i] * w[i] : values[i];);                                   \
            break;                                                                                                  \
        case MIN: /* numpy's minimum(kept, value): kept if smaller or NaN, else value (on a tie, 0.0 vs -0.0) */    \
            EACH_ROW(T, ONE, rn += one; if (!(rv < values[i]) && !isnan(rv)) rv = values[i];);                      \
            break;                                                                                                  \
        case MAX:                                                                                                   \
            EACH_ROW(T, ONE, rn += one; if (!(rv > values[i]) && !isnan(rv)) rv = values[i];);                      \
            break;                                                                                                  \
        case SLA:                                                                                                   \
            EACH_ROW(T, ONE, rn += one; rok += PICK(status[i] != 0, one););                                         \
            break;                                                                                                  \
        case APDEX:                                                                                                 \
            EACH_ROW(T, ONE, rn += one; int good = status[i] != 0; int low = values[i] <= threshold;               \
                     int mid = (values[i] > threshold) & (values[i] <= four); rok += PICK(good & low, one);         \
                     rtol += PICK(good & mid, one););                                                               \
            break;                                                                                                  \
        }                                                                                                           \
    } while (0)

/* a row's addition to a category it may not be in, without a branch (the categories are random from row to row):
 * 0 or 1 as a number, or the weight or 0.0 (a weight that is not a number must not reach the other categories) */
#define ONE_IF(c, one) ((int64_t)(c))
#define WEIGHT_IF(c, one) ((c) ? (one) : 0.0)

/* the loops into the tallies nt, okt, tolt (int64 without weights, else float64) and v; 0, or -1 with an exception */
static int
state_loops(const Input *in, int function, void *nt, void *okt, void *tolt, double *v, double threshold)
{
    const int64_t *gid = in->gid.data;
    const uint8_t *status = in->status.data;
    const double *values = in->values.data, *w = in->weights.data;
    const Py_ssize_t size = in->size;
    const double four = 4 * threshold;
    if (w)
        FUNCTION_LOOPS(double, w[i], WEIGHT_IF);
    else
        FUNCTION_LOOPS(int64_t, 1, ONE_IF);
    return 0;
}

/* a tally as a bytearray of int64: the counts as they are, or the weighted sums truncated; NULL with an exception */
static PyObject *
tally_result(const void *tally, Py_ssize_t size, int weighted)
{
    int64_t *out;
    PyObject *a = new_array(size * 8, (void **)&out);
    if (a != NULL) {
        if (!weighted)
            memcpy(out, tally, (size_t)size * 8);
        else
            for (Py_ssize_t g = 0; g < size; g++)
                out[g] = (int64_t)((const double *)tally)[g];
    }
    return a;
}

static PyObject *
states(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "states(function, gid, size, values, status, weights, threshold)");
        return NULL;
    }
    int function = (int)PyLong_AsLong(args[0]);
    double threshold = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (function < COUNT || function > APDEX) {
        PyErr_SetString(PyExc_ValueError, "states: unknown function");
        return NULL;
    }
    int needs_values = function == SUM || function == MIN || function == MAX || function == APDEX;
    int needs_status = function == SLA || function == APDEX;
    Input in;
    PyObject *result = NULL, *v_out = NULL, *outs[3] = {NULL, NULL, NULL};
    void *tallies[3] = {NULL, NULL, NULL}; /* n, ok, tol (8 bytes a group either way) */
    if (input_get(&in, args[1], args[2], args[3], args[4], args[5], !needs_values) < 0)
        goto done;
    if ((needs_values && !in.values.data) || (needs_status && !in.status.data)) {
        PyErr_SetString(PyExc_ValueError, "states: this function needs values and status");
        goto done;
    }
    Py_ssize_t size = in.size, count = function == APDEX ? 3 : function == SLA ? 2 : 1;
    for (Py_ssize_t k = 0; k < count; k++)
        if (!(tallies[k] = PyMem_Calloc((size_t)(size ? size : 1), 8))) {
            PyErr_NoMemory();
            goto done;
        }
    double *v = NULL;
    if (function == SUM || function == MIN || function == MAX) {
        if (!(v_out = new_array(size * 8, (void **)&v)))
            goto done;
        double start = function == SUM ? 0.0 : function == MIN ? INFINITY : -INFINITY;
        for (Py_ssize_t g = 0; g < size; g++)
            v[g] = start;
    }
    if (state_loops(&in, function, tallies[0], tallies[1], tallies[2], v, threshold) < 0)
        goto done;
    for (Py_ssize_t k = 0; k < count; k++)
        if (!(outs[k] = tally_result(tallies[k], size, in.weights.data != NULL)))
            goto done;
    if (v_out)
        result = PyTuple_Pack(2, outs[0], v_out);
    else
        result = count == 1 ? PyTuple_Pack(1, outs[0])
                 : count == 2 ? PyTuple_Pack(2, outs[0], outs[1]) : PyTuple_Pack(3, outs[0], outs[1], outs[2]);
done:
    Py_XDECREF(v_out);
    for (int k = 0; k < 3; k++) {
        Py_XDECREF(outs[k]);
        PyMem_Free(tallies[k]);
    }
    input_release(&in);
    return result;
}

/* ------------------------------------------------------------------------------------------------ histogram */

#define BIN_MAX 9007199254740992.0 /* 2^53: latencies beyond it share the last bin, as in the numpy path */

static inline int64_t
bin_of(double value, double precision)
{
    double b = floor(value / precision);
    return (int64_t)(b < BIN_MAX ? b : BIN_MAX);
}

static int
bin_order(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* histogram's (group, bin, n) where the dense table of groups x bins would be too large (many groups, latencies
 * spread over many bins), group by group: the rows are put in group order (a counting sort on the group id, stable),
 * then each group's rows are counted in one row of `bins` counters (at most the dense table's limit; a few
 * kilobytes for latencies, in cache), its bins that occur sorted and emitted, and only those counters cleared.
 * Counts accumulate in row order, as the dense table and numpy's bincount accumulate them. NULL with an exception
 * set. */
static PyObject *
grouped_histogram(const int64_t *gid, const int64_t *bins_of, const double *w, Py_ssize_t n, Py_ssize_t size,
                  int64_t low, Py_ssize_t bins)
{
    PyObject *result = NULL, *outs[3] = {NULL, NULL, NULL};
    Py_ssize_t *start = PyMem_Calloc((size_t)size + 1, sizeof *start), *rows = PyMem_Malloc(((size_t)n + 1) *
                                                                                             sizeof *rows);
    int64_t *whole = w ? NULL : PyMem_Calloc((size_t)bins, sizeof *whole);
    double *weighted = w ? PyMem_Calloc((size_t)bins, sizeof *weighted) : NULL;
    uint8_t *seen = PyMem_Calloc((size_t)bins, 1);
    int64_t *found = PyMem_Malloc((size_t)bins * sizeof *found); /* one group's bins that occur */
    int64_t *group, *bin, *count;
    if (!start || !rows || !seen || !found || (!whole && !weighted))
        goto nomem;
    for (Py_ssize_t i = 0; i < n; i++)
        if (gid[i] >= 0)
            start[gid[i] + 1]++;
    for (Py_ssize_t g = 0; g < size; g++)
        start[g + 1] += start[g];
    Py_ssize_t counted = start[size];
    {
        Py_ssize_t *next = PyMem_Malloc(((size_t)size + 1) * sizeof *next);
        if (!next)
            goto nomem;
        memcpy(next, start, ((size_t)size + 1) * sizeof *next);
        for (Py_ssize_t i = 0; i < n; i++)
            if (gid[i] >= 0)
                rows[next[gid[i]]++] = i;
        PyMem_Free(next);
    }
    /* at most one pair per counted row: the output arrays, trimmed to the pairs after */
    Py_ssize_t pairs = 0;
    if (!(outs[0] = new_array(counted * 8, (void **)&group)) || !(outs[1] = new_array(counted * 8, (void **)&bin)) ||
        !(outs[2] = new_array(counted * 8, (void **)&count)))
        goto done;
    for (Py_ssize_t g = 0; g < size; g++) {
        Py_ssize_t k = 0;
        for (Py_ssize_t r = start[g]; r < start[g + 1]; r++) {
            Py_ssize_t i = rows[r], b = (Py_ssize_t)(bins_of[i] - low);
            if (!seen[b]) {
                seen[b] = 1;
                found[k++] = b;
            }
            if (w)
                weighted[b] += w[i];
            else
                whole[b]++;
        }
        if (k > 32) /* (latencies come in any order: insertion sort only for a few bins) */
            qsort(found, (size_t)k, sizeof *found, bin_order);
        else
            for (Py_ssize_t x = 1; x < k; x++) {
                int64_t v = found[x];
                Py_ssize_t y = x;
                for (; y > 0 && found[y - 1] > v; y--)
                    found[y] = found[y - 1];
                found[y] = v;
            }
        for (Py_ssize_t x = 0; x < k; x++) {
            Py_ssize_t b = (Py_ssize_t)found[x];
            group[pairs] = g;
            bin[pairs] = low + b;
            if (w) {
                count[pairs] = (int64_t)weighted[b];
                weighted[b] = 0.0;
            } else {
                count[pairs] = whole[b];
                whole[b] = 0;
            }
            seen[b] = 0;
            pairs++;
        }
    }
    for (int j = 0; j < 3; j++)
        if (PyByteArray_Resize(outs[j], pairs * 8) < 0)
            goto done;
    result = PyTuple_Pack(3, outs[0], outs[1], outs[2]);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    for (int j = 0; j < 3; j++)
        Py_XDECREF(outs[j]);
    PyMem_Free(start);
    PyMem_Free(rows);
    PyMem_Free(whole);
    PyMem_Free(weighted);
    PyMem_Free(seen);
    PyMem_Free(found);
    return result;
}

static PyObject *
histogram(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "histogram(gid, size, values, weights, precision)");
        return NULL;
    }
    double precision = PyFloat_AsDouble(args[4]);
    if (precision == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(precision > 0)) {
        PyErr_SetString(PyExc_ValueError, "histogram: precision must be positive");
        return NULL;
    }
    Input in;
    PyObject *result = NULL, *outs[3] = {NULL, NULL, NULL};
    int64_t *bins_of = NULL, *whole = NULL;
    double *weighted = NULL;
    uint8_t *seen = NULL;
    if (input_get(&in, args[0], args[1], args[2], NULL, args[3], 0) < 0)
        goto done;
    const int64_t *gid = in.gid.data;
    const double *values = in.values.data, *w = in.weights.data;
    if (!(bins_of = PyMem_Malloc((size_t)(in.n ? in.n : 1) * sizeof *bins_of)))
        goto nomem;
    /* each counted row's bin, and their range */
    int64_t low = INT64_MAX, high = INT64_MIN;
    for (Py_ssize_t i = 0; i < in.n; i++) {
        if (gid[i] < 0)
            continue;
        if (gid[i] >= in.size) {
            id_error();
            goto done;
        }
        if (isnan(values[i])) /* (validation refuses such a latency; the numpy path has its own answer) */
            goto decline;
        int64_t b = bins_of[i] = bin_of(values[i], precision);
        low = b < low ? b : low;
        high = b > high ? b : high;
    }
    if (low > high)
        low = high = 0; /* no row counted */
    /* the dense table: groups x bins cells, as many as numpy's dense limit allows; else group by group */
    double limit = (double)(4 * in.n > 65536 ? 4 * in.n : 65536);
    double span = ((double)high - (double)low + 1) * (double)(in.size ? in.size : 1);
    if (span > limit) {
        if ((double)high - (double)low + 1 > limit) /* (a row of counters as long as the dense table: numpy's) */
            goto decline;
        result = grouped_histogram(gid, bins_of, w, in.n, in.size, low, (Py_ssize_t)(high - low + 1));
        goto done;
    }
    Py_ssize_t bins = (Py_ssize_t)(high - low + 1), cells = bins * in.size;
    seen = PyMem_Calloc((size_t)(cells ? cells : 1), 1);
    if (w)
        weighted = PyMem_Calloc((size_t)(cells ? cells : 1), sizeof *weighted);
    else
        whole = PyMem_Calloc((size_t)(cells ? cells : 1), sizeof *whole);
    if (!seen || (!weighted && !whole))
        goto nomem;
    Py_ssize_t pairs = 0;
    for (Py_ssize_t i = 0; i < in.n; i++) {
        if (gid[i] < 0)
            continue;
        Py_ssize_t cell = (Py_ssize_t)gid[i] * bins + (Py_ssize_t)(bins_of[i] - low);
        pairs += !seen[cell];
        seen[cell] = 1;
        if (w)
            weighted[cell] += w[i];
        else
            whole[cell]++;
    }
    int64_t *group, *bin, *count;
    if (!(outs[0] = new_array(pairs * 8, (void **)&group)) || !(outs[1] = new_array(pairs * 8, (void **)&bin)) ||
        !(outs[2] = new_array(pairs * 8, (void **)&count)))
        goto done;
    for (Py_ssize_t cell = 0, k = 0; cell < cells; cell++)
        if (seen[cell]) {
            group[k] = cell / bins;
            bin[k] = low + cell % bins;
            count[k] = w ? (int64_t)weighted[cell] : whole[cell];
            k++;
        }
    result = PyTuple_Pack(3, outs[0], outs[1], outs[2]);
    goto done;
nomem:
    PyErr_NoMemory();
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < 3; k++)
        Py_XDECREF(outs[k]);
    PyMem_Free(bins_of);
    PyMem_Free(whole);
    PyMem_Free(weighted);
    PyMem_Free(seen);
    input_release(&in);
    return result;
}

#include "_strings.h"

static PyMethodDef methods[] = {
    {"groups", (PyCFunction)(void (*)(void))groups, METH_FASTCALL,
     "groups(services, subs, excluded, ts, width_ms) -> (gid, first): dense group ids of the rows' (service, sub, "
     "slot) keys in key order (see _groupstates.c)."},
    {"states", (PyCFunction)(void (*)(void))states, METH_FASTCALL,
     "states(function, gid, size, values, status, weights, threshold) -> (n, ...): one metric's states per "
     "group in one pass (see _groupstates.c)."},
    {"histogram", (PyCFunction)(void (*)(void))histogram, METH_FASTCALL,
     "histogram(gid, size, values, weights, precision) -> (group, bin, n) | None: the rows counted per (group, "
     "bin) (see _groupstates.c)."},
    {"encode", (PyCFunction)(void (*)(void))strings_encode, METH_FASTCALL,
     "encode(chunks) -> (codes, first): a string column's codes, in the order its values first occur, and the row "
     "of each code's first value (see _strings.h)."},
    {"gather", (PyCFunction)(void (*)(void))strings_gather, METH_FASTCALL,
     "gather(parts, separator) -> (offsets, data): string values taken by row, each part's joined by separator "
     "(see _strings.h)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "drainpipe.native._groupstates",
    "An event batch's group ids and per-group metric states, a pass over the rows each (see _groupstates.c).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__groupstates(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "COUNT", COUNT) < 0 || PyModule_AddIntConstant(m, "SUM", SUM) < 0 ||
        PyModule_AddIntConstant(m, "MIN", MIN) < 0 || PyModule_AddIntConstant(m, "MAX", MAX) < 0 ||
        PyModule_AddIntConstant(m, "SLA", SLA) < 0 || PyModule_AddIntConstant(m, "APDEX", APDEX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
