/* drainpipe.native (the OTLP scanners): the span mapping applied to a scan's columns in C, so that a scanner returns
 * events (included by _otlpjson.c and _otlpproto.c; their `events`, the tuple in _otlpproto.pyi). The rules are
 * _spanrules.h's (stated at the top of _spanmap.c); what this adds is the assembly of inputs/span_events.py's
 * map_columns: per event its ts, service, instance, raw endpoint (requests), statement (exit rows), latency and
 * status, the requests first, then the exit rows, each in span order; and the rejected spans.
 */
#ifndef DRAINPIPE_SPANEVENTS_H
#define DRAINPIPE_SPANEVENTS_H

#include "_hash.h"
#include "_spancols.h"
#include "_spanrules.h"

/* A pool's one-byte-per-pair validity as an Arrow bitmap (into `into`), or NULL when every pair is valid (or with
 * a Python error set: memory). */
static const uint8_t *
packed(const Buf *bytes, Buf *into)
{
    if (all_set(bytes))
        return NULL;
    into->len = 0;
    if (buf_reserve(into, (bytes->len + 7) / 8 + 1) < 0)
        return NULL;
    pack_bits((const unsigned char *)bytes->data, bytes->len, (unsigned char *)into->data);
    return (const uint8_t *)into->data;
}

static Pool
pool_view(const Buf *pool, Py_ssize_t owners, Buf packs[3])
{
    Pool p = {owners, (const int32_t *)pool[A_OWNERS].data, NULL,
              packed(&pool[A_VVALID], &packs[0]), packed(&pool[A_TVALID], &packs[1]),
              packed(&pool[A_IVALID], &packs[2]), (const int32_t *)pool[A_KOFF].data,
              (const int32_t *)pool[A_TOFF].data, pool[A_KDATA].data, pool[A_TDATA].data,
              (const int64_t *)pool[A_IDATA].data};
    return p;
}

/* Append the text of pair `i` of `pool` (or `fallback`) to a string column. */
static int
put_text(Buf *off, Buf *data, const Buf *pool, int64_t i, const char *fallback, size_t fallback_len)
{
    if (i >= 0) {
        const int32_t *toff = (const int32_t *)pool[A_TOFF].data;
        if (buf_put(data, pool[A_TDATA].data + toff[i], (size_t)(toff[i + 1] - toff[i])) < 0)
            return -1;
    }
    else if (buf_put(data, fallback, fallback_len) < 0)
        return -1;
    return put_offset(off, data->len);
}

/* The requests' raw endpoints, dictionary-encoded as the events are assembled: the distinct values in the order
 * they first appear (offsets and data), an open-addressing table over them (value index + 1 per slot, 0 empty), and
 * each event's code (int32; an exit row gets the code past the last value, which Python maps to ""). Python then
 * normalizes each distinct value once and gathers the templates by code (span_gather): no pass over the rows in
 * pyarrow, whose compute calls each let the GIL go (under load another thread takes it, and winning it back cost
 * the connection loop more than the pass itself). */
typedef struct {
    Buf off, data; /* the distinct values (offsets start at 0) */
    int32_t *table;
    size_t count, cap;
} Distinct;

static inline int
distinct_equal(const Distinct *d, int32_t k, const char *s, size_t n)
{
    const int32_t *off = (const int32_t *)d->off.data;
    return (size_t)(off[k + 1] - off[k]) == n && (n == 0 || !memcmp(d->data.data + off[k], s, n));
}

/* The code of the n bytes at s (added if new): >= 0, or -1 with MemoryError set. */
static int32_t
distinct_code(Distinct *d, const char *s, size_t n)
{
    if (2 * (d->count + 1) > d->cap) { /* at most half full: grow (and rehash) first */
        size_t cap = d->cap ? 2 * d->cap : 64;
        int32_t *table = PyMem_Calloc(cap, sizeof *table);
        if (table == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        const int32_t *off = (const int32_t *)d->off.data;
        for (size_t k = 0; k < d->count; k++) {
            const unsigned char *value = (const unsigned char *)d->data.data + off[k];
            size_t g = (size_t)bytes_hash(value, (size_t)(off[k + 1] - off[k])) & (cap - 1);
            while (table[g])
                g = (g + 1) & (cap - 1);
            table[g] = (int32_t)k + 1;
        }
        PyMem_Free(d->table);
        d->table = table, d->cap = cap;
    }
    size_t h = (size_t)bytes_hash((const unsigned char *)s, n) & (d->cap - 1);
    for (int32_t at; (at = d->table[h]); h = (h + 1) & (d->cap - 1))
        if (distinct_equal(d, at - 1, s, n))
            return at - 1;
    if (buf_put(&d->data, s, n) < 0 || put_offset(&d->off, d->data.len) < 0)
        return -1;
    d->table[h] = (int32_t)++d->count;
    return (int32_t)d->count - 1;
}

/* The distinct values as a list of str (valid UTF-8 by construction: the scanners check every string), or NULL. */
static PyObject *
distinct_list(const Distinct *d)
{
    PyObject *list = PyList_New((Py_ssize_t)d->count);
    if (list == NULL)
        return NULL;
    const int32_t *off = (const int32_t *)d->off.data;
    for (size_t k = 0; k < d->count; k++) {
        Py_ssize_t n = off[k + 1] - off[k];
        PyObject *text = n == 0 ? PyUnicode_New(0, 0) : PyUnicode_DecodeUTF8(d->data.data + off[k], n, "strict");
        if (text == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)k, text);
    }
    return list;
}

/* gather(codes, texts) -> (offsets, data): the string column whose row i is texts[codes[i]] (codes: int32 bytes,
 * each in range; texts: a list of str), as Arrow's int32 offsets and data. The endpoint column from its normalized
 * distinct values, in one pass that holds the GIL. */
static PyObject *
span_gather(PyObject *self, PyObject *args)
{
    Py_buffer codes;
    PyObject *texts;
    if (!PyArg_ParseTuple(args, "y*O!", &codes, &PyList_Type, &texts))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t k = PyList_GET_SIZE(texts), rows = codes.len / 4;
    const char **text = PyMem_Malloc(sizeof *text * (size_t)(k + 1));
    Py_ssize_t *size = PyMem_Malloc(sizeof *size * (size_t)(k + 1));
    Buf off = {NULL, 0, 0}, data = {NULL, 0, 0};
    if (text == NULL || size == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t total = 0;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *item = PyList_GET_ITEM(texts, j);
        if (!PyUnicode_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "gather: texts must be str");
            goto done;
        }
        if ((text[j] = PyUnicode_AsUTF8AndSize(item, &size[j])) == NULL)
            goto done;
    }
    const int32_t *code = (const int32_t *)codes.buf;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (code[i] < 0 || code[i] >= k) {
            PyErr_Format(PyExc_IndexError, "gather: code %d out of range", (int)code[i]);
            goto done;
        }
        total += (size_t)size[code[i]];
    }
    if (total > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "gather: more than 2 GiB of text");
        goto done;
    }
    if (buf_reserve(&off, 4 * (size_t)(rows + 1)) < 0 || buf_reserve(&data, total + 1) < 0)
        goto done;
    int32_t *o = (int32_t *)off.data;
    o[0] = 0;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (size[code[i]])
            memcpy(data.data + data.len, text[code[i]], (size_t)size[code[i]]);
        data.len += (size_t)size[code[i]];
        o[i + 1] = (int32_t)data.len;
    }
    off.len = 4 * (size_t)(rows + 1);
    result = Py_BuildValue("(NN)", bytes_of(&off), bytes_of(&data));
done:
    PyBuffer_Release(&codes);
    PyMem_Free(text);
    PyMem_Free(size);
    PyMem_Free(off.data);
    PyMem_Free(data.data);
    return result;
}

/* The events' columns. */
enum { E_ROWS, E_TS, E_LAT, E_OK, E_SVC_OFF, E_SVC, E_INST_OFF, E_INST, E_EP_CODE, E_PER_EXPORT, E_ST_OFF, E_ST,
       E_ST_VALID, E_REJ_EXPORT, E_REJ_INDEX, E_REJ_CAT, E_PACK, E_NBUFS = E_PACK + 3 };

#define UNKNOWN_SERVICE "unknown_service"

/* What the mapping needs from Python: the roles of span attributes (endpoint 0, statement 1, HTTP status 2) and
 * of resource attributes (service 0, instance 1), the request kinds, the CLIENT and SERVER kinds, the latency
 * bound. `keep` holds the role keys alive. */
typedef struct {
    Role span_roles[MAX_ROLES], res_roles[MAX_ROLES];
    Py_ssize_t n_span_roles, n_res_roles;
    unsigned long long request_kinds;
    int client, server;
    double latency_max;
    PyObject *keep[2];
} Mapping;

/* Parse (span_roles, resource_roles, request_kinds, client, server, latency_max_ms) from `args` starting at
 * `first`. 0, or -1 with an exception set (then nothing is held). */
static int
mapping_parse(PyObject *args, Py_ssize_t first, Mapping *m)
{
    PyObject *span_roles, *res_roles;
    PyObject *tail = PyTuple_GetSlice(args, first, PyTuple_GET_SIZE(args));
    if (tail == NULL)
        return -1;
    int ok = PyArg_ParseTuple(tail, "OOKiid", &span_roles, &res_roles, &m->request_kinds, &m->client, &m->server,
                              &m->latency_max);
    Py_DECREF(tail);
    if (!ok)
        return -1;
    m->keep[0] = rules_roles(span_roles, 3, m->span_roles, &m->n_span_roles);
    if (m->keep[0] == NULL)
        return -1;
    m->keep[1] = rules_roles(res_roles, 2, m->res_roles, &m->n_res_roles);
    if (m->keep[1] == NULL) {
        Py_DECREF(m->keep[0]);
        return -1;
    }
    return 0;
}

static void
mapping_release(Mapping *m)
{
    Py_DECREF(m->keep[0]);
    Py_DECREF(m->keep[1]);
}

/* The events of the spans in `c` (export `first[k]` is export k's first span), as the tuple of _otlpproto.pyi's
 * events, `declined` first. NULL with an exception set. */
static PyObject *
cols_events(const Cols *c, const Buf *first_spans, const Mapping *m, PyObject *declined)
{
    Buf e[E_NBUFS];
    memset(e, 0, sizeof e);
    int64_t *res_pair = NULL, *span_pair = NULL, *http = NULL;
    int8_t *cat = NULL;
    uint8_t *ok = NULL;
    double *lat = NULL;
    PyObject *result = NULL, *endpoints = NULL;
    Distinct ep = {{NULL, 0, 0}, {NULL, 0, 0}, NULL, 0, 0};
    static const int OFFSETS[] = {E_SVC_OFF, E_INST_OFF, E_ST_OFF}; /* each starts at 0 */
    if (put_i32(&ep.off, 0) < 0)
        goto done;
    for (size_t i = 0; i < sizeof OFFSETS / sizeof *OFFSETS; i++)
        if (put_i32(&e[OFFSETS[i]], 0) < 0)
            goto done;
    const Py_ssize_t S = c->spans, R = c->resources;
    const Buf *o = c->out;
    res_pair = PyMem_Malloc(sizeof(int64_t) * (2 * R + 1));
    span_pair = PyMem_Malloc(sizeof(int64_t) * (3 * S + 1));
    http = PyMem_Malloc(sizeof(int64_t) * (S + 1));
    cat = PyMem_Malloc(S + 1);
    ok = PyMem_Malloc(S + 1);
    lat = PyMem_Malloc(sizeof(double) * (S + 1));
    if (!res_pair || !span_pair || !http || !cat || !ok || !lat) {
        PyErr_NoMemory();
        goto done;
    }
    Pool res_pool = pool_view(&o[RES_POOL], R, &e[E_PACK]);
    if (PyErr_Occurred())
        goto done;
    rules_pick(&res_pool, m->res_roles, m->n_res_roles, 2, -1, res_pair, NULL);
    Pool span_pool = pool_view(&o[SPAN_POOL], S, &e[E_PACK]); /* (the packs are reused: the resource pick is done) */
    if (PyErr_Occurred())
        goto done;
    rules_pick(&span_pool, m->span_roles, m->n_span_roles, 3, 2, span_pair, http);
    const int64_t *stmt = span_pair + S;
    SpanView v = {S, (const int32_t *)o[S_KIND].data, (const int32_t *)o[S_CODE].data,
                  (const int32_t *)o[S_TOFF].data, (const int32_t *)o[S_SOFF].data, (const uint64_t *)o[S_START].data,
                  (const uint64_t *)o[S_END].data, NULL, (const uint8_t *)o[S_TDATA].data,
                  (const uint8_t *)o[S_SDATA].data};
    Py_ssize_t bad_trace, bad_span;
    rules_classify(&v, stmt, http, m->request_kinds, m->client, m->server, m->latency_max, cat, ok, lat, &bad_trace,
                   &bad_span);

    const int64_t *resource = (const int64_t *)o[S_RESOURCE].data, *first = (const int64_t *)first_spans->data;
    const int32_t *line = (const int32_t *)o[S_LINE].data, *noff = (const int32_t *)o[S_NOFF].data;
    const uint64_t *end = v.end;
    const Py_ssize_t exports = (Py_ssize_t)(first_spans->len / 8);
    if (buf_reserve(&e[E_PER_EXPORT], 8 * (size_t)exports + 8) < 0)
        goto done;
    memset(e[E_PER_EXPORT].data, 0, 8 * (size_t)exports);
    e[E_PER_EXPORT].len = 8 * (size_t)exports;
    int64_t *per_export = (int64_t *)e[E_PER_EXPORT].data;
    Py_ssize_t requests = 0, rows = 0;
    for (int pass = 1; pass <= 2; pass++) { /* the requests, then the exit rows */
        for (Py_ssize_t i = 0; i < S; i++) {
            if (cat[i] != pass)
                continue;
            int64_t r = resource[i];
            if (put_i64(&e[E_ROWS], i) < 0 || put_i64(&e[E_TS], (int64_t)(end[i] / 1000000u)) < 0 ||
                buf_put(&e[E_LAT], &lat[i], 8) < 0 || put_u8(&e[E_OK], ok[i]) < 0 ||
                put_text(&e[E_SVC_OFF], &e[E_SVC], &o[RES_POOL], res_pair[r], UNKNOWN_SERVICE,
                         sizeof UNKNOWN_SERVICE - 1) < 0 ||
                put_text(&e[E_INST_OFF], &e[E_INST], &o[RES_POOL], res_pair[R + r], "", 0) < 0 ||
                put_u8(&e[E_ST_VALID], pass == 2) < 0 ||
                put_text(&e[E_ST_OFF], &e[E_ST], &o[SPAN_POOL], pass == 2 ? stmt[i] : -1, "", 0) < 0)
                goto done;
            int32_t code = (int32_t)ep.count; /* an exit row: past the last value */
            if (pass == 1) { /* the chosen attribute's text, else the span's name */
                int64_t a = span_pair[i];
                const int32_t *toff = (const int32_t *)o[SPAN_POOL + A_TOFF].data;
                const char *text = a >= 0 ? o[SPAN_POOL + A_TDATA].data + toff[a] : o[S_NDATA].data + noff[i];
                size_t len = (size_t)(a >= 0 ? toff[a + 1] - toff[a] : noff[i + 1] - noff[i]);
                code = distinct_code(&ep, text, len);
                if (code < 0)
                    goto done;
            }
            if (put_i32(&e[E_EP_CODE], code) < 0)
                goto done;
            per_export[line[i]]++;
            rows++;
            requests += pass == 1;
        }
    }
    for (Py_ssize_t i = 0; i < S; i++)
        if (cat[i] < 0 && (put_i32(&e[E_REJ_EXPORT], line[i]) < 0 ||
                           put_i32(&e[E_REJ_INDEX], (int32_t)(i - first[line[i]])) < 0 ||
                           put_u8(&e[E_REJ_CAT], (uint8_t)cat[i]) < 0))
            goto done;
    if ((endpoints = distinct_list(&ep)) == NULL)
        goto done;
    result = Py_BuildValue("(OnnNNNNNNNNONNNNNNNnnNNNNNNN)", declined, S, requests, bytes_of(&e[E_ROWS]),
                           bytes_of(&e[E_TS]), bytes_of(&e[E_LAT]), bits_of(&e[E_OK]), bytes_of(&e[E_SVC_OFF]),
                           bytes_of(&e[E_SVC]), bytes_of(&e[E_INST_OFF]), bytes_of(&e[E_INST]), endpoints,
                           bytes_of(&e[E_EP_CODE]), bytes_of(&e[E_ST_OFF]), bytes_of(&e[E_ST]),
                           bitmap_of(&e[E_ST_VALID]), bytes_of(&e[E_REJ_EXPORT]), bytes_of(&e[E_REJ_INDEX]),
                           bytes_of(&e[E_REJ_CAT]), bad_trace, bad_span, bytes_of(&o[S_TOFF]), bytes_of(&o[S_TDATA]),
                           bytes_of(&o[S_SOFF]), bytes_of(&o[S_SDATA]), bytes_of(&o[S_XOFF]), bytes_of(&o[S_XDATA]),
                           bytes_of(&e[E_PER_EXPORT]));
done:
    Py_XDECREF(endpoints);
    PyMem_Free(ep.off.data);
    PyMem_Free(ep.data.data);
    PyMem_Free(ep.table);
    PyMem_Free(res_pair);
    PyMem_Free(span_pair);
    PyMem_Free(http);
    PyMem_Free(cat);
    PyMem_Free(ok);
    PyMem_Free(lat);
    for (int i = 0; i < E_NBUFS; i++)
        PyMem_Free(e[i].data);
    return result;
}

#endif
