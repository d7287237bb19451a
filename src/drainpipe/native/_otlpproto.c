/* drainpipe.native._otlpproto: OTLP protobuf trace exports (ExportTraceServiceRequest, as OTLP/HTTP, OTLP/gRPC and
 * the OpenTelemetry Collector's Kafka exporter send them) -> the span columns the OTLP mapping reads, in one pass
 * over the wire bytes.
 *
 * Why C: the reference (inputs/otlp.py) parses an export with the official classes (upb) to judge it, then reads
 * it again with ptars into Arrow columns, then the mapping reads those with some forty numpy and pyarrow calls: two
 * decodes and an Arrow detour per export. One pass here validates the exports as protobuf would and fills the span
 * columns the JSON scanner fills (_spancols.h): `scan` returns those. `events` goes on, in C, to the events: the
 * span rules of _spanrules.h (the ones _spanmap.c applies to any span columns) and the event columns, requests
 * then exit rows, the endpoints dictionary-encoded; Python is left only the distinct endpoints to normalize, their
 * column to gather by code (`gather`, in C) and the columns to wrap (inputs/span_events.py, map_proto_exports), with
 * no pyarrow or numpy pass over the rows. A 512-span export: ~0.2 us a span in the pass.
 *
 * It is a fast path, never the judge: it accepts only exports whose meaning under the reference is beyond doubt
 * and declines the others, export by export, and the caller decodes a declined export with the reference (which
 * accepts it, or rejects it with its reason). An export is accepted only when all of these hold:
 *   - the wire format is sound: every tag has a field number > 0 and a wire type of 0, 1, 2 or 5 (groups
 *     decline), varints end within 10 bytes, tags and lengths within 5 (upb refuses longer ones: MAX_TAG_LEN),
 *     lengths stay within their message;
 *   - every field of the OTLP trace messages has its schema's wire type (protobuf would read a field of another
 *     wire type as an unknown one: it declines), and a singular field this pass reads (or must merge: a resource, a
 *     status, a value) appears at most once; an AnyValue has at most one member (protobuf keeps the last);
 *     Resource.entity_refs declines; unknown field numbers are skipped, as protobuf skips them;
 *   - every string field, read or not, is valid UTF-8 (protobuf refuses the export otherwise);
 *   - an enum (kind, status code) is an int32 varint (sign-extended to 10 bytes when negative);
 *   - nesting of array and kvlist values is at most MAX_DEPTH deep (upb refuses an export nested more than 100
 *     messages deep: see MAX_DEPTH).
 * What it returns per accepted export is what ptars reads from the projection of inputs/span_columns.py: its
 * resources (attributes into the resource pool; an absent resource has none) and its spans in export order
 * (export, resource, kind, start, end, status code (0 without a status), trace and span ids as bytes, name, trace
 * state, attributes into the span pool). Attribute values: whether a pair has a value, its string value, its
 * integer value; other value types count as a value that is neither.
 */
#include "_spanevents.h"

/* upb refuses an export whose messages nest more than 100 deep. A kvlist level is three messages (AnyValue,
 * KeyValueList, KeyValue), an array level two, and an event's or a link's attribute values start six below the
 * export: 6 + 3 * 30 leaves room, and no exporter nests values a tenth as deep. */
#define MAX_DEPTH 30
/* upb reads a tag or a length in at most 5 bytes (a 32-bit varint) and refuses the export otherwise. */
#define MAX_TAG_LEN 5

/* A message being read, and where the whole scan stands. */
typedef struct {
    const unsigned char *p, *end;
} Msg;

typedef struct {
    Cols c;
    int32_t export;
    int depth;
} Scan;

enum { VARINT = 0, I64 = 1, LEN = 2, I32 = 5 };

static inline int
varint(Msg *m, uint64_t *out)
{
    if (m->p < m->end && *m->p < 0x80) { /* one byte: every tag here, most lengths (a branch less per byte) */
        *out = *m->p++;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (m->p >= m->end)
            return 1;
        unsigned char b = *m->p++;
        if (i == 9 && b > 1)
            return 1; /* past 64 bits */
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return 1;
}

/* The next field's number and wire type. */
static inline int
tag(Msg *m, uint32_t *field, int *wire)
{
    uint64_t t;
    const unsigned char *start = m->p;
    TRY(varint(m, &t));
    if (m->p - start > MAX_TAG_LEN)
        return 1;
    *field = (uint32_t)(t >> 3);
    *wire = (int)(t & 7);
    if (*field == 0 || t >> 32)
        return 1;
    return 0;
}

/* A length-delimited field's bytes, as a message of its own. */
static inline int
sub(Msg *m, Msg *into)
{
    uint64_t n;
    const unsigned char *start = m->p;
    TRY(varint(m, &n));
    if (m->p - start > MAX_TAG_LEN || n > (uint64_t)(m->end - m->p))
        return 1;
    into->p = m->p;
    into->end = m->p + n;
    m->p += n;
    return 0;
}

static inline int
fixed(Msg *m, size_t n, void *out)
{
    if ((size_t)(m->end - m->p) < n)
        return 1;
    if (out)
        memcpy(out, m->p, n); /* (little-endian, as the wire) */
    m->p += n;
    return 0;
}

/* A field this pass does not read, of a valid wire type. */
static int
skip(Msg *m, int wire)
{
    uint64_t v;
    Msg ignored;
    switch (wire) {
    case VARINT: return varint(m, &v);
    case I64: return fixed(m, 8, NULL);
    case LEN: return sub(m, &ignored);
    case I32: return fixed(m, 4, NULL);
    default: return 1; /* groups (3, 4), and 6, 7: no such wire type */
    }
}

/* A string field (wire type checked by the caller): valid UTF-8, appended to `into` if any. */
static int
string(Msg *m, Buf *into)
{
    Msg s;
    TRY(sub(m, &s));
    size_t n = (size_t)(s.end - s.p);
    if (!utf8_valid(s.p, n))
        return 1;
    return into && buf_put(into, s.p, n) < 0 ? -1 : 0;
}

/* A bytes field, appended to `into` if any. */
static int
bytes(Msg *m, Buf *into)
{
    Msg s;
    TRY(sub(m, &s));
    return into && buf_put(into, s.p, (size_t)(s.end - s.p)) < 0 ? -1 : 0;
}

/* An int32 field (an enum): as protobuf reads it, or decline a varint that is not one. */
static int
int32_field(Msg *m, int32_t *out)
{
    uint64_t v;
    TRY(varint(m, &v));
    if (v > INT32_MAX && v < 0xFFFFFFFF80000000ull)
        return 1;
    *out = (int32_t)(uint32_t)v;
    return 0;
}

/* Each message's fields: the wire type of field k at [k] (-1 for a field number this pass does not know). */
#define KNOWN(types, f) ((f) < sizeof(types) / sizeof *(types) && (types)[f] >= 0)

/* At the top of a message's loop: skip a field of a number `types` does not know and go on to the next, decline a
 * known one of another wire type. (Statements, not a do-while: `continue` is the loop's.) */
#define FIELD(m, types, f, wire)                                                                                  \
    if (!KNOWN(types, f)) {                                                                                       \
        TRY(skip(m, wire));                                                                                       \
        continue;                                                                                                 \
    }                                                                                                             \
    if ((types)[f] != (wire))                                                                                     \
        return 1

/* A singular field seen once only: `seen` holds a bit per field number. */
#define ONCE(seen, f)                                                                                             \
    do {                                                                                                          \
        if ((seen) & (1u << (f)))                                                                                 \
            return 1;                                                                                             \
        (seen) |= 1u << (f);                                                                                      \
    } while (0)

/* ------------------------------------------------------------------------------------------- attribute values */

typedef struct {
    Buf *pool; /* NULL: validated only */
    int has_text, has_int;
    int64_t int_value;
} Pair;

static int key_value(Scan *s, Msg *m, Buf *pool);
static int any_value(Scan *s, Msg *m, Pair *pair);

/* ArrayValue and KeyValueList: field 1, repeated (AnyValue or KeyValue). */
static const signed char LIST_TYPES[] = {-1, LEN};

static int
value_list(Scan *s, Msg *m, int kv)
{
    if (++s->depth > MAX_DEPTH)
        return 1;
    uint32_t f;
    int wire;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, LIST_TYPES, f, wire);
        Msg item;
        TRY(sub(m, &item));
        TRY(kv ? key_value(s, &item, NULL) : any_value(s, &item, NULL));
    }
    s->depth--;
    return 0;
}

/* AnyValue: string 1, bool 2, int 3, double 4, array 5, kvlist 6, bytes 7; a oneof. */
static const signed char ANY_TYPES[] = {-1, LEN, VARINT, VARINT, I64, LEN, LEN, LEN};

static int
any_value(Scan *s, Msg *m, Pair *pair)
{
    uint32_t f;
    int wire, members = 0;
    uint64_t v;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, ANY_TYPES, f, wire);
        if (members++)
            return 1;
        Msg list;
        switch (f) {
        case 1:
            TRY(string(m, pair && pair->pool ? &pair->pool[A_TDATA] : NULL));
            if (pair)
                pair->has_text = 1;
            break;
        case 3:
            TRY(varint(m, &v));
            if (pair) {
                pair->has_int = 1;
                pair->int_value = (int64_t)v;
            }
            break;
        case 5:
        case 6:
            TRY(sub(m, &list));
            TRY(value_list(s, &list, f == 6));
            break;
        default: TRY(skip(m, wire)); /* bool, double, bytes: neither a string nor an integer */
        }
    }
    return 0;
}

/* KeyValue: key 1, value 2. A row of `pool`, or validated only (NULL). */
static const signed char KEY_VALUE_TYPES[] = {-1, LEN, LEN};

static int
key_value(Scan *s, Msg *m, Buf *pool)
{
    Pair pair = {pool, 0, 0, 0};
    unsigned seen = 0;
    uint32_t f;
    int wire;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, KEY_VALUE_TYPES, f, wire);
        ONCE(seen, f);
        if (f == 1)
            TRY(string(m, pool ? &pool[A_KDATA] : NULL));
        else {
            Msg value;
            TRY(sub(m, &value));
            TRY(any_value(s, &value, &pair));
        }
    }
    return pool == NULL ? 0 : cols_pair(pool, (seen >> 2) & 1, pair.has_text, pair.has_int, pair.int_value);
}

/* A repeated KeyValue field's one element. */
static int
attribute(Scan *s, Msg *m, Buf *pool)
{
    Msg kv;
    TRY(sub(m, &kv));
    return key_value(s, &kv, pool);
}

/* ------------------------------------------------------------------------------------------------- messages */

/* Status: message 2, code 3 (1 is reserved: an unknown field). */
static const signed char STATUS_TYPES[] = {-1, -1, LEN, VARINT};

static int
status(Msg *m, int32_t *code)
{
    unsigned seen = 0;
    uint32_t f;
    int wire;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, STATUS_TYPES, f, wire);
        if (f == 2)
            TRY(string(m, NULL));
        else {
            ONCE(seen, f);
            TRY(int32_field(m, code));
        }
    }
    return 0;
}

/* Span.Event: time 1, name 2, attributes 3, dropped 4. */
static const signed char EVENT_TYPES[] = {-1, I64, LEN, LEN, VARINT};

static int
event(Scan *s, Msg *m)
{
    uint32_t f;
    int wire;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, EVENT_TYPES, f, wire);
        if (f == 2)
            TRY(string(m, NULL));
        else if (f == 3)
            TRY(attribute(s, m, NULL));
        else
            TRY(skip(m, wire));
    }
    return 0;
}

/* Span.Link: trace id 1, span id 2, trace state 3, attributes 4, dropped 5, flags 6. */
static const signed char LINK_TYPES[] = {-1, LEN, LEN, LEN, LEN, VARINT, I32};

static int
span_link(Scan *s, Msg *m)
{
    uint32_t f;
    int wire;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, LINK_TYPES, f, wire);
        if (f == 3)
            TRY(string(m, NULL));
        else if (f == 4)
            TRY(attribute(s, m, NULL));
        else
            TRY(skip(m, wire));
    }
    return 0;
}

/* Span: trace id 1, span id 2, trace state 3, parent span id 4, name 5, kind 6, start 7, end 8, attributes 9,
 * dropped attributes 10, events 11, dropped events 12, links 13, dropped links 14, status 15, flags 16. */
static const signed char SPAN_TYPES[] = {-1, LEN, LEN, LEN, LEN, LEN, VARINT, I64, I64, LEN, VARINT, LEN, VARINT, LEN,
                                         VARINT, LEN, I32};

static int
span(Scan *s, Msg *m)
{
    Buf *o = s->c.out;
    int32_t kind = 0, code = 0;
    uint64_t start = 0, end = 0;
    unsigned seen = 0;
    uint32_t f;
    int wire;
    Msg part;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, SPAN_TYPES, f, wire);
        switch (f) {
        case 1: ONCE(seen, f); TRY(bytes(m, &o[S_TDATA])); break;
        case 2: ONCE(seen, f); TRY(bytes(m, &o[S_SDATA])); break;
        case 3: ONCE(seen, f); TRY(string(m, &o[S_XDATA])); break;
        case 5: ONCE(seen, f); TRY(string(m, &o[S_NDATA])); break;
        case 6: ONCE(seen, f); TRY(int32_field(m, &kind)); break;
        case 7: ONCE(seen, f); TRY(fixed(m, 8, &start)); break;
        case 8: ONCE(seen, f); TRY(fixed(m, 8, &end)); break;
        case 9: TRY(attribute(s, m, &o[SPAN_POOL])); break;
        case 11: TRY(sub(m, &part)); TRY(event(s, &part)); break;
        case 13: TRY(sub(m, &part)); TRY(span_link(s, &part)); break;
        case 15: ONCE(seen, f); TRY(sub(m, &part)); TRY(status(&part, &code)); break;
        default: TRY(skip(m, wire)); /* parent span id, flags, the dropped counts */
        }
    }
    return cols_span(&s->c, s->export, kind, start, end, code);
}

/* InstrumentationScope: name 1, version 2, attributes 3, dropped 4. */
static const signed char SCOPE_TYPES[] = {-1, LEN, LEN, LEN, VARINT};

static int
scope(Scan *s, Msg *m)
{
    uint32_t f;
    int wire;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, SCOPE_TYPES, f, wire);
        if (f <= 2)
            TRY(string(m, NULL));
        else if (f == 3)
            TRY(attribute(s, m, NULL));
        else
            TRY(skip(m, wire));
    }
    return 0;
}

/* ScopeSpans: scope 1, spans 2, schema url 3. */
static const signed char SCOPE_SPANS_TYPES[] = {-1, LEN, LEN, LEN};

static int
scope_spans(Scan *s, Msg *m)
{
    uint32_t f;
    int wire;
    Msg part;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, SCOPE_SPANS_TYPES, f, wire);
        if (f == 3)
            TRY(string(m, NULL));
        else {
            TRY(sub(m, &part));
            TRY(f == 1 ? scope(s, &part) : span(s, &part));
        }
    }
    return 0;
}

/* Resource: attributes 1, dropped 2, entity refs 3 (declines). */
static const signed char RESOURCE_TYPES[] = {-1, LEN, VARINT, LEN};

static int
resource(Scan *s, Msg *m)
{
    uint32_t f;
    int wire;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, RESOURCE_TYPES, f, wire);
        if (f == 3)
            return 1;
        TRY(f == 1 ? attribute(s, m, &s->c.out[RES_POOL]) : skip(m, wire));
    }
    return 0;
}

/* ResourceSpans: resource 1, scope spans 2, schema url 3. */
static const signed char RESOURCE_SPANS_TYPES[] = {-1, LEN, LEN, LEN};

static int
resource_spans(Scan *s, Msg *m)
{
    s->c.resources++; /* its spans name it while it is read; its attributes close when it does */
    unsigned seen = 0;
    uint32_t f;
    int wire;
    Msg part;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, RESOURCE_SPANS_TYPES, f, wire);
        if (f == 3) {
            TRY(string(m, NULL));
            continue;
        }
        TRY(sub(m, &part));
        if (f == 1) {
            ONCE(seen, f);
            TRY(resource(s, &part));
        }
        else
            TRY(scope_spans(s, &part));
    }
    return cols_owner(&s->c.out[RES_POOL]);
}

/* ExportTraceServiceRequest: resource spans 1. */
static const signed char REQUEST_TYPES[] = {-1, LEN};

static int
request(Scan *s, Msg *m)
{
    uint32_t f;
    int wire;
    Msg part;
    while (m->p < m->end) {
        TRY(tag(m, &f, &wire));
        FIELD(m, REQUEST_TYPES, f, wire);
        TRY(sub(m, &part));
        TRY(resource_spans(s, &part));
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ the block */

/* Read every export of `exports` into s->c (exports declined: rolled back and listed in `declined`); `first`, if
 * given, gets each export's first span index (int64). 0, or -1 with a Python error. */
static int
scan_all(Scan *s, PyObject *seq, PyObject *declined, Buf *first)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Mark mark;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &view, PyBUF_SIMPLE) < 0)
            return -1;
        Msg m = {view.buf, (const unsigned char *)view.buf + view.len};
        s->export = (int32_t)i;
        s->depth = 0;
        if (first && put_i64(first, s->c.spans) < 0) {
            PyBuffer_Release(&view);
            return -1;
        }
        cols_mark(&s->c, &mark);
        int r = request(s, &m);
        PyBuffer_Release(&view);
        if (r < 0)
            return -1;
        if (r) { /* roll the export back; the reference reads it */
            cols_rollback(&s->c, &mark);
            if (cols_decline(declined, i) < 0)
                return -1;
        }
    }
    return 0;
}

/* scan(exports) -> (declined, spans, resources, span columns..., span pool, resource pool): the tuple of
 * _otlpjson.scan, an export for a line. */
static PyObject *
scan(PyObject *module, PyObject *exports)
{
    PyObject *seq = PySequence_Fast(exports, "scan(exports): a sequence of bytes-like objects");
    if (seq == NULL)
        return NULL;
    Scan s;
    memset(&s, 0, sizeof s);
    PyObject *declined = PyList_New(0), *result = NULL;
    if (cols_begin(&s.c) < 0 || declined == NULL || scan_all(&s, seq, declined, NULL) < 0)
        goto done;
    result = cols_result(declined, &s.c);
done:
    Py_XDECREF(declined);
    Py_DECREF(seq);
    cols_done(&s.c);
    return result;
}

/* events(exports, span_roles, resource_roles, request_kinds, client, server, latency_max_ms) -> the events of the
 * exports, the span mapping done in the pass (the tuple in _otlpproto.pyi; _spanevents.h). */
static PyObject *
events(PyObject *module, PyObject *args)
{
    Mapping m;
    if (PyTuple_GET_SIZE(args) < 1) {
        PyErr_SetString(PyExc_TypeError, "events(exports, span_roles, resource_roles, request_kinds, ...)");
        return NULL;
    }
    if (mapping_parse(args, 1, &m) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(PyTuple_GET_ITEM(args, 0), "events(exports, ...): a sequence of bytes-like "
                                                               "objects");
    if (seq == NULL) {
        mapping_release(&m);
        return NULL;
    }
    Scan s;
    memset(&s, 0, sizeof s);
    Buf first = {NULL, 0, 0};
    PyObject *declined = NULL, *result = NULL;
    if (cols_begin(&s.c) == 0 && (declined = PyList_New(0)) != NULL && scan_all(&s, seq, declined, &first) == 0)
        result = cols_events(&s.c, &first, &m, declined);
    PyMem_Free(first.data);
    Py_XDECREF(declined);
    Py_DECREF(seq);
    mapping_release(&m);
    cols_done(&s.c);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(exports) -> the span columns of OTLP protobuf trace exports, and the exports declined (see "
     "_otlpproto.c)."},
    {"events", events, METH_VARARGS,
     "events(exports, span_roles, resource_roles, request_kinds, client, server, latency_max_ms) -> the event "
     "columns of OTLP protobuf trace exports, the span mapping done in the pass (see _otlpproto.c)."},
    {"gather", span_gather, METH_VARARGS,
     "gather(codes, texts) -> (offsets, data): the string column of texts[code] per int32 code (see "
     "_spanevents.h)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "drainpipe.native._otlpproto",
    "OTLP protobuf trace exports -> span columns in one pass (see _otlpproto.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__otlpproto(void)
{
    return PyModule_Create(&module);
}
