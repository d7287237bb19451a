/* drainpipe.native (the OTLP span mapping): the per-span rules, over plain column buffers (included by _spanmap.c,
 * which applies them to any span columns for inputs/span_events.py, and by _otlpproto.c, which applies them inside
 * its pass). The rules are stated at the top of _spanmap.c.
 */
#ifndef DRAINPIPE_SPANRULES_H
#define DRAINPIPE_SPANRULES_H

#include <stdint.h>
#include <string.h>

#define MAX_FIELDS 8
#define MAX_ROLES 64

static inline int
bit(const uint8_t *bitmap, Py_ssize_t i)
{
    return bitmap == NULL || (bitmap[i >> 3] >> (i & 7)) & 1;
}

/* One key's role: the field it gives and its rank among the field's keys (lower first). */
typedef struct {
    const char *key;
    Py_ssize_t len;
    int field;
    int64_t rank;
} Role;

/* A sequence of (key bytes, field, rank) -> roles (at most MAX_ROLES, fields below `fields`); returns the sequence,
 * which keeps the keys alive, or NULL with an exception set. */
static PyObject *
rules_roles(PyObject *roles_obj, int fields, Role *roles, Py_ssize_t *nroles)
{
    PyObject *seq = PySequence_Fast(roles_obj, "roles must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_ROLES) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many roles");
        return NULL;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, r);
        long long rank;
        if (!PyArg_ParseTuple(item, "y#iL", &roles[r].key, &roles[r].len, &roles[r].field, &rank) ||
            roles[r].field < 0 || roles[r].field >= fields) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a role's field is out of range");
            return NULL;
        }
        roles[r].rank = rank;
    }
    *nroles = n;
    return seq;
}

/* An attribute pool as buffers: owner o's pairs are offsets[o]..offsets[o + 1]; validity bitmaps may be NULL (all
 * valid). */
typedef struct {
    Py_ssize_t owners;
    const int32_t *offsets;
    const uint8_t *present, *vvalid, *tvalid, *ivalid;
    const int32_t *koff, *toff;
    const char *kdata, *tdata;
    const int64_t *idata;
} Pool;

/* Per owner and field, the attribute of the lowest rank whose value suits the field (out_pair[field * owners + o],
 * -1 for none); with status_field >= 0, that field's value goes to out_status[o] (-1 for none). */
static void
rules_pick(const Pool *a, const Role *roles, Py_ssize_t nroles, int fields, int status_field, int64_t *out_pair,
           int64_t *out_status)
{
    const Py_ssize_t owners = a->owners;
    const int32_t *offsets = a->offsets, *koff = a->koff, *toff = a->toff;
    const uint8_t *present = a->present, *vvalid = a->vvalid, *tvalid = a->tvalid, *ivalid = a->ivalid;
    const char *kdata = a->kdata, *tdata = a->tdata;
    const int64_t *idata = a->idata;
for (Py_ssize_t o = 0; o < owners; o++) {
    int64_t best[MAX_FIELDS];
    for (int f = 0; f < fields; f++) {
        best[f] = INT64_MAX;
        out_pair[f * owners + o] = -1;
    }
    if (status_field >= 0)
        out_status[o] = -1;
    if (!bit(present, o))
        continue;
    for (Py_ssize_t i = offsets[o]; i < offsets[o + 1]; i++) {
        const char *key = kdata + koff[i];
        Py_ssize_t klen = koff[i + 1] - koff[i];
        if (!bit(vvalid, i))
            continue;
        int has_text = bit(tvalid, i);
        Py_ssize_t tlen = has_text ? toff[i + 1] - toff[i] : 0;
        for (Py_ssize_t r = 0; r < nroles; r++) {
            const Role *role = &roles[r];
            if (role->len != klen || memcmp(role->key, key, klen) != 0 || role->rank >= best[role->field])
                continue;
            if (role->field == status_field) {
                int64_t status;
                if (bit(ivalid, i)) { /* (the caller passes None only when every value is an integer) */
                    status = idata[i];
                } else if (tlen > 0) {
                    const char *t = tdata + toff[i];
                    status = 0;
                    Py_ssize_t k = 0;
                    for (; k < tlen && t[k] >= '0' && t[k] <= '9'; k++)
                        status = status < ((int64_t)1 << 58) ? status * 10 + (t[k] - '0') : (int64_t)1 << 62;
                    if (k < tlen)
                        continue; /* not all ASCII digits: no status */
                } else {
                    continue;
                }
                out_status[o] = status;
            } else if (tlen == 0) {
                continue;
            }
            best[role->field] = role->rank;
            out_pair[role->field * owners + o] = i;
        }
    }
}
}

/* Whether the n bytes at id are not all zero. */
static inline int
nonzero(const uint8_t *id, int32_t n)
{
    uint8_t any = 0;
    for (int32_t j = 0; j < n; j++)
        any |= id[j];
    return any != 0;
}

/* Whether a trace id can be used (inputs/trace_ids.py): 16 bytes, or a 64-bit id of 8, not all zero. */
static inline int
trace_id_usable(const uint8_t *id, int32_t n)
{
    return (n == 16 || n == 8) && nonzero(id, n);
}

/* The spans' columns classify reads. */
typedef struct {
    Py_ssize_t n;
    const int32_t *kind, *scode, *toff, *soff;
    const uint64_t *start, *end;
    const uint8_t *svalid, *tdata, *sdata;
} SpanView;

/* Per span: cat (1 request, 2 exit row, 0 neither, -3 end before start, -4 latency out of range), ok, latency (ms);
 * *bad_trace and *bad_span count the mapped spans whose ids cannot be used. `stmt` and `http` are pick's. */
static void
rules_classify(const SpanView *v, const int64_t *stmt, const int64_t *http, unsigned long long request_kinds,
               int client, int server, double latency_max, int8_t *cat, uint8_t *ok, double *lat,
               Py_ssize_t *bad_trace_out, Py_ssize_t *bad_span_out)
{
    const Py_ssize_t n = v->n;
    const int32_t *kind = v->kind, *scode = v->scode, *toff = v->toff, *soff = v->soff;
    const uint64_t *start = v->start, *end = v->end;
    const uint8_t *svalid = v->svalid, *tdata = v->tdata, *sdata = v->sdata;
Py_ssize_t bad_trace = 0, bad_span = 0;
for (Py_ssize_t i = 0; i < n; i++) {
    int32_t k = kind[i];
    int is_request = k >= 0 && k < 64 && (request_kinds >> k) & 1;
    int is_exit = !is_request && k == client && stmt[i] >= 0;
    ok[i] = 0;
    lat[i] = 0.0;
    if (!is_request && !is_exit) {
        cat[i] = 0;
        continue;
    }
    if (end[i] < start[i]) {
        cat[i] = -3;
        continue;
    }
    double latency = (double)(end[i] - start[i]) / 1e6; /* as Python's (end - start) / 1e6 */
    if (latency > latency_max) {
        cat[i] = -4;
        continue;
    }
    int32_t code = bit(svalid, i) ? scode[i] : 0;
    int success = code != 2; /* ERROR */
    if (success && code == 0 && k == server && http[i] >= 0)
        success = http[i] < 500;
    cat[i] = is_request ? 1 : 2;
    ok[i] = (uint8_t)success;
    lat[i] = latency;
    bad_trace += !trace_id_usable(tdata + toff[i], toff[i + 1] - toff[i]);
    bad_span += !(soff[i + 1] - soff[i] == 8 && nonzero(sdata + soff[i], 8));
}
    *bad_trace_out = bad_trace;
    *bad_span_out = bad_span;
}

#endif
