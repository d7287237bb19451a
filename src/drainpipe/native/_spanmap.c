/* drainpipe.native._spanmap: the per-span part of the OTLP span mapping, over the Arrow columns that ptars read.
 *
 * Why C: with the spans already in Arrow columns (inputs/span_columns.py), what was left of the mapping was some
 * forty numpy and pyarrow calls per export, each a few microseconds on arrays of a thousand spans: ~0.6 ms per
 * export, more than reading the export itself. The rules are a few comparisons per span and per attribute, so one
 * pass in C does them in a few tens of microseconds. Nothing here reads the protobuf wire format: the input is
 * Arrow buffers (offsets, validity bitmaps, values), already decoded.
 *
 * The rules (docs/pipeline.md, "OpenTelemetry spans"; inputs/otlp.py applies them and builds the events):
 *   pick:     per owner (a span or a resource) and per field, the attribute of the lowest rank among the field's
 *             keys whose value suits the field (the earliest of equals): a non-empty string for a text field; an
 *             integer, or a string of ASCII digits, for the status field, whose value is returned too;
 *   classify: per span, whether it is a request (its kind is in the request kinds), an exit row (a CLIENT span
 *             with a statement) or neither; for the first two, the first check that fails (end before start,
 *             latency over the bound), else its latency and whether it succeeded (not ERROR; a SERVER span with
 *             status UNSET also fails with an HTTP status >= 500). Its ids never cost it: the metrics do not need
 *             them (the Collector's spanmetrics connector counts such spans too), so a span whose trace id or span
 *             id cannot be used is mapped, and counted for a warning (the trace id's rule is inputs/trace_ids.py's:
 *             16 bytes, or 8 left-padded with zeros, not all zero; a span id is 8 bytes, not all zero).
 * The inputs are unsliced arrays (offset 0), as a fresh ptars batch holds; the caller checks that.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_spanrules.h"


/* A buffer argument: None (an absent validity bitmap) or any object with the buffer protocol. */
typedef struct {
    Py_buffer view;
    int held;
} Buf;

static int
get_buf(PyObject *obj, Buf *b, int writable, Py_ssize_t min_len, const char *name)
{
    b->held = 0;
    if (obj == Py_None) {
        b->view.buf = NULL;
        b->view.len = 0;
        return 0;
    }
    if (PyObject_GetBuffer(obj, &b->view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    b->held = 1;
    if (b->view.len < min_len) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected at least %zd", name, b->view.len, min_len);
        return -1;
    }
    return 0;
}

static void
release(Buf *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (bufs[i].held)
            PyBuffer_Release(&bufs[i].view);
}

/* pick(owners, list_offsets, present, key_offsets, key_data, value_valid, text_valid, text_offsets, text_data,
 *      int_valid, int_data, roles, fields, status_field, out_pair, out_status) -> None
 * out_pair: int64[fields][owners] (attribute index, -1 for none); out_status: int64[owners] or None. */
static PyObject *
pick(PyObject *self, PyObject *args)
{
    Py_ssize_t owners;
    int fields, status_field;
    PyObject *o_offsets, *o_present, *o_koff, *o_kdata, *o_vvalid, *o_tvalid, *o_toff, *o_tdata, *o_ivalid,
        *o_idata, *roles_obj, *o_pair, *o_status;
    if (!PyArg_ParseTuple(args, "nOOOOOOOOOOOiiOO", &owners, &o_offsets, &o_present, &o_koff, &o_kdata, &o_vvalid,
                          &o_tvalid, &o_toff, &o_tdata, &o_ivalid, &o_idata, &roles_obj, &fields, &status_field,
                          &o_pair, &o_status))
        return NULL;
    if (fields < 1 || fields > MAX_FIELDS || owners < 0) {
        PyErr_SetString(PyExc_ValueError, "pick: bad field count or owner count");
        return NULL;
    }
    Role roles[MAX_ROLES];
    Py_ssize_t nroles;
    PyObject *seq = rules_roles(roles_obj, fields, roles, &nroles);
    if (seq == NULL)
        return NULL;
    /* the role keys stay alive in seq (bytes objects) until the end */
    Buf b[13];
    memset(b, 0, sizeof(b));
    if (get_buf(o_offsets, &b[0], 0, (owners + 1) * 4, "list_offsets") < 0)
        goto fail;
    const int32_t *offsets = b[0].view.buf;
    Py_ssize_t n = offsets[owners]; /* attributes */
    if (offsets[0] != 0 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "pick: list offsets must start at 0");
        goto fail;
    }
    if (get_buf(o_present, &b[1], 0, (owners + 7) / 8, "present") < 0 ||
        get_buf(o_koff, &b[2], 0, (n + 1) * 4, "key_offsets") < 0 || get_buf(o_kdata, &b[3], 0, 0, "key_data") < 0 ||
        get_buf(o_vvalid, &b[4], 0, (n + 7) / 8, "value_valid") < 0 ||
        get_buf(o_tvalid, &b[5], 0, (n + 7) / 8, "text_valid") < 0 ||
        get_buf(o_toff, &b[6], 0, (n + 1) * 4, "text_offsets") < 0 ||
        get_buf(o_tdata, &b[7], 0, 0, "text_data") < 0 || get_buf(o_ivalid, &b[8], 0, (n + 7) / 8, "int_valid") < 0 ||
        get_buf(o_idata, &b[9], 0, n * 8, "int_data") < 0 ||
        get_buf(o_pair, &b[10], 1, owners * fields * 8, "out_pair") < 0 ||
        get_buf(o_status, &b[11], 1, status_field >= 0 ? owners * 8 : 0, "out_status") < 0)
        goto fail;
    const uint8_t *present = b[1].view.buf, *vvalid = b[4].view.buf, *tvalid = b[5].view.buf,
                  *ivalid = b[8].view.buf;
    const int32_t *koff = b[2].view.buf, *toff = b[6].view.buf;
    const char *kdata = b[3].view.buf, *tdata = b[7].view.buf;
    const int64_t *idata = b[9].view.buf;
    int64_t *out_pair = b[10].view.buf, *out_status = b[11].view.buf;
    if (koff[n] > b[3].view.len || toff[n] > b[7].view.len) {
        PyErr_SetString(PyExc_ValueError, "pick: offsets past the data");
        goto fail;
    }
    if (status_field >= 0 && out_status == NULL) {
        PyErr_SetString(PyExc_ValueError, "pick: a status field needs out_status");
        goto fail;
    }

    Pool pool = {owners, offsets, present, vvalid, tvalid, ivalid, koff, toff, kdata, tdata, idata};
    rules_pick(&pool, roles, nroles, fields, status_field, out_pair, out_status);
    release(b, 13);
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    release(b, 13);
    Py_DECREF(seq);
    return NULL;
}

/* classify(kind, start, end, status_valid, status_code, tid_offsets, tid_data, sid_offsets, sid_data, statement,
 *          http_status, request_kinds, client, server, latency_max_ms, out_cat, out_ok, out_latency)
 *   -> (mapped spans whose trace id cannot be used, mapped spans whose span id cannot be used)
 * out_cat: int8 per span: 1 request, 2 exit row, 0 neither, -3 end before start, -4 latency out of range. */
static PyObject *
classify(PyObject *self, PyObject *args)
{
    PyObject *o_kind, *o_start, *o_end, *o_svalid, *o_scode, *o_toff, *o_tdata, *o_soff, *o_sdata, *o_stmt,
        *o_http, *o_cat, *o_ok, *o_lat;
    unsigned long long request_kinds;
    int client, server;
    double latency_max;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOKiidOOO", &o_kind, &o_start, &o_end, &o_svalid, &o_scode, &o_toff,
                          &o_tdata, &o_soff, &o_sdata, &o_stmt, &o_http, &request_kinds, &client, &server,
                          &latency_max, &o_cat, &o_ok, &o_lat))
        return NULL;
    Buf b[14];
    memset(b, 0, sizeof(b));
    if (get_buf(o_kind, &b[0], 0, 0, "kind") < 0)
        goto fail;
    Py_ssize_t n = b[0].view.len / 4;
    if (get_buf(o_start, &b[1], 0, n * 8, "start") < 0 || get_buf(o_end, &b[2], 0, n * 8, "end") < 0 ||
        get_buf(o_svalid, &b[3], 0, (n + 7) / 8, "status_valid") < 0 ||
        get_buf(o_scode, &b[4], 0, n * 4, "status_code") < 0 ||
        get_buf(o_toff, &b[5], 0, (n + 1) * 4, "tid_offsets") < 0 || get_buf(o_tdata, &b[6], 0, 0, "tid_data") < 0 ||
        get_buf(o_soff, &b[7], 0, (n + 1) * 4, "sid_offsets") < 0 || get_buf(o_sdata, &b[8], 0, 0, "sid_data") < 0 ||
        get_buf(o_stmt, &b[9], 0, n * 8, "statement") < 0 || get_buf(o_http, &b[10], 0, n * 8, "http_status") < 0 ||
        get_buf(o_cat, &b[11], 1, n, "out_cat") < 0 || get_buf(o_ok, &b[12], 1, n, "out_ok") < 0 ||
        get_buf(o_lat, &b[13], 1, n * 8, "out_latency") < 0)
        goto fail;
    const int32_t *kind = b[0].view.buf, *scode = b[4].view.buf, *toff = b[5].view.buf, *soff = b[7].view.buf;
    const uint64_t *start = b[1].view.buf, *end = b[2].view.buf;
    const uint8_t *svalid = b[3].view.buf, *tdata = b[6].view.buf, *sdata = b[8].view.buf;
    const int64_t *stmt = b[9].view.buf, *http = b[10].view.buf;
    int8_t *cat = b[11].view.buf;
    uint8_t *ok = b[12].view.buf;
    double *lat = b[13].view.buf;
    if (toff[0] != 0 || soff[0] != 0 || toff[n] > b[6].view.len || soff[n] > b[8].view.len) {
        PyErr_SetString(PyExc_ValueError, "classify: id offsets must start at 0 and stay within the data");
        goto fail;
    }

    SpanView v = {n, kind, scode, toff, soff, start, end, svalid, tdata, sdata};
    Py_ssize_t bad_trace, bad_span;
    rules_classify(&v, stmt, http, request_kinds, client, server, latency_max, cat, ok, lat, &bad_trace, &bad_span);
    release(b, 14);
    return Py_BuildValue("(nn)", bad_trace, bad_span);
fail:
    release(b, 14);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pick", pick, METH_VARARGS, "Per owner and field: the first-ranked attribute whose value suits the field."},
    {"classify", classify, METH_VARARGS,
     "Per span: request, exit row, neither, or why it is rejected; the mapped spans whose ids cannot be used."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "drainpipe.native._spanmap", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__spanmap(void)
{
    return PyModule_Create(&module);
}
