/* drainpipe.native (the OTLP scanners): the span mapping applied to a scan's columns in C, so that a scanner returns
 * events (included by _otlpjson.c and _otlpproto.c; their `events`, the tuple in _otlpproto.pyi). The rules are
 * _spanrules.h's (stated at the top of _spanmap.c); what this adds is the assembly of inputs/span_events.py's
 * map_columns: per event its ts, service, instance, raw endpoint (requests), statement (exit rows), latency and
 * status, the requests first, then the exit rows, each in span order; and the rejected spans.
 */
#ifndef DRAINPIPE_SPANEVENTS_H
#define DRAINPIPE_SPANEVENTS_H

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
    return put_i32(off, (int32_t)data->len);
}

/* The events' columns. */
enum { E_ROWS, E_TS, E_LAT, E_OK, E_SVC_OFF, E_SVC, E_INST_OFF, E_INST, E_EP_OFF, E_EP, E_ST_OFF, E_ST, E_ST_VALID,
       E_REJ_EXPORT, E_REJ_INDEX, E_REJ_CAT, E_PACK, E_NBUFS = E_PACK + 3 };

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
 * events, `declined` first, `first` last. NULL with an exception set. */
static PyObject *
cols_events(const Cols *c, const Buf *first_spans, const Mapping *m, PyObject *declined)
{
    Buf e[E_NBUFS];
    memset(e, 0, sizeof e);
    int64_t *res_pair = NULL, *span_pair = NULL, *http = NULL;
    int8_t *cat = NULL;
    uint8_t *ok = NULL;
    double *lat = NULL;
    PyObject *result = NULL;
    static const int OFFSETS[] = {E_SVC_OFF, E_INST_OFF, E_EP_OFF, E_ST_OFF}; /* each starts at 0 */
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
            if (pass == 1 && put_text(&e[E_EP_OFF], &e[E_EP], &o[SPAN_POOL], span_pair[i],
                                      o[S_NDATA].data + noff[i], (size_t)(noff[i + 1] - noff[i])) < 0)
                goto done;
            rows++;
            requests += pass == 1;
        }
    }
    for (Py_ssize_t i = 0; i < S; i++)
        if (cat[i] < 0 && (put_i32(&e[E_REJ_EXPORT], line[i]) < 0 ||
                           put_i32(&e[E_REJ_INDEX], (int32_t)(i - first[line[i]])) < 0 ||
                           put_u8(&e[E_REJ_CAT], (uint8_t)cat[i]) < 0))
            goto done;
    result = Py_BuildValue("(OnnNNNNNNNNNNNNNNNNnnNNNNNNN)", declined, S, requests, bytes_of(&e[E_ROWS]),
                           bytes_of(&e[E_TS]), bytes_of(&e[E_LAT]), bits_of(&e[E_OK]), bytes_of(&e[E_SVC_OFF]),
                           bytes_of(&e[E_SVC]), bytes_of(&e[E_INST_OFF]), bytes_of(&e[E_INST]),
                           bytes_of(&e[E_EP_OFF]), bytes_of(&e[E_EP]), bytes_of(&e[E_ST_OFF]), bytes_of(&e[E_ST]),
                           bitmap_of(&e[E_ST_VALID]), bytes_of(&e[E_REJ_EXPORT]), bytes_of(&e[E_REJ_INDEX]),
                           bytes_of(&e[E_REJ_CAT]), bad_trace, bad_span, bytes_of(&o[S_TOFF]), bytes_of(&o[S_TDATA]),
                           bytes_of(&o[S_SOFF]), bytes_of(&o[S_SDATA]), bytes_of(&o[S_XOFF]), bytes_of(&o[S_XDATA]),
                           bytes_of(first_spans));
done:
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
