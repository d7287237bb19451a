/* drainpipe.native (the OTLP scanners): the span columns an OTLP export is read into, the same for every wire
 * format (included by _otlpjson.c and _otlpproto.c), and the tuple a scan returns (_otlpjson.pyi).
 *
 * A scan reads a block of exports (lines of OTLP JSON, or protobuf messages) into one set of columns: per span its
 * export, resource, kind, start, end, status code, trace and span ids, name and trace state; per pair of the span
 * and resource attribute pools its owner, key, and value (whether it has one, its string, its integer). An export
 * the scanner declines is rolled back (cols_mark / cols_rollback) and listed by index; the reference decodes it.
 * The buffers of the last scan are kept for the next (cols_begin / cols_done): a block's columns are tens of MB, and
 * fresh buffers cost a page fault per 4 KB as they grow. The GIL is held through a scan, so one set per extension
 * serves.
 */
#ifndef DRAINPIPE_SPANCOLS_H
#define DRAINPIPE_SPANCOLS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A growing byte buffer. */
typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, size_t n)
{
    if (b->len + n <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n)
        cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int
buf_put(Buf *b, const void *p, size_t n)
{
    if (n == 0)
        return 0; /* (p may be NULL then: an empty escaped string) */
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static inline int
put_i32(Buf *b, int32_t v) { return buf_put(b, &v, 4); }
static inline int
put_i64(Buf *b, int64_t v) { return buf_put(b, &v, 8); }
static inline int
put_u64(Buf *b, uint64_t v) { return buf_put(b, &v, 8); }
static inline int
put_u8(Buf *b, uint8_t v) { return buf_put(b, &v, 1); }

/* A string column's next offset: Arrow's are 32-bit, so a column past 2 GiB of text is an OverflowError (an export
 * whose resource repeats a long value on every span can ask for that from a small body), never a wrapped offset. */
static inline int
put_offset(Buf *b, size_t len)
{
    if (len > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of text in one column");
        return -1;
    }
    return put_i32(b, (int32_t)len);
}

/* Every output buffer, by index: the span columns, then the two attribute pools (span and resource). */
enum {
    S_LINE, S_RESOURCE, S_KIND, S_START, S_END, S_CODE, S_TOFF, S_TDATA, S_SOFF, S_SDATA, S_NOFF, S_NDATA,
    S_XOFF, S_XDATA, S_NBUFS
};
enum { A_OWNERS, A_KOFF, A_KDATA, A_VVALID, A_TVALID, A_TOFF, A_TDATA, A_IVALID, A_IDATA, A_NBUFS };
#define SPAN_POOL S_NBUFS
#define RES_POOL (S_NBUFS + A_NBUFS)
#define NBUFS (S_NBUFS + 2 * A_NBUFS)

/* Where a scan stands: the columns, a scratch buffer (a decoded string), the counts so far. */
typedef struct {
    Buf out[NBUFS];
    Buf scratch;
    int64_t spans, resources;
} Cols;

/* Results of the scanners' steps: 0 done, 1 decline the export, -1 a Python error (memory). */
#define TRY(x)                                                                                                    \
    do {                                                                                                          \
        int r_ = (x);                                                                                             \
        if (r_)                                                                                                   \
            return r_;                                                                                            \
    } while (0)

static int
utf8_valid(const unsigned char *q, size_t n)
{
    size_t i = 0;
    while (i < n) {
        /* ASCII eight bytes at a time: names, keys and most values are all ASCII */
        uint64_t w;
        while (i + 8 <= n && (memcpy(&w, q + i, 8), !(w & 0x8080808080808080ull)))
            i += 8;
        if (i == n)
            break;
        unsigned c = q[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t more;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F; /* no UTF-16 surrogates */
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        }
        else
            return 0;
        if (i + more >= n)
            return 0;
        if (q[i + 1] < lo || q[i + 1] > hi)
            return 0;
        for (size_t j = 2; j <= more; j++)
            if (q[i + j] < 0x80 || q[i + j] > 0xBF)
                return 0;
        i += more + 1;
    }
    return 1;
}

/* One row of an attribute pool, its key and text already appended to the pool's data. */
static int
cols_pair(Buf *pool, int has_value, int has_text, int has_int, int64_t int_value)
{
    if (put_offset(&pool[A_KOFF], pool[A_KDATA].len) < 0 || put_u8(&pool[A_VVALID], (uint8_t)has_value) < 0 ||
        put_u8(&pool[A_TVALID], (uint8_t)has_text) < 0 || put_offset(&pool[A_TOFF], pool[A_TDATA].len) < 0 ||
        put_u8(&pool[A_IVALID], (uint8_t)has_int) < 0 || put_i64(&pool[A_IDATA], has_int ? int_value : 0) < 0)
        return -1;
    return 0;
}

/* The owner (a span, a resource) whose pairs were the last ones added to `pool` is complete. */
static int
cols_owner(Buf *pool)
{
    return put_i32(&pool[A_OWNERS], (int32_t)(pool[A_KOFF].len / 4 - 1));
}

/* One span of export `line` and of the latest resource, its ids, name, trace state and attributes already added. */
static int
cols_span(Cols *c, int32_t line, int32_t kind, uint64_t start, uint64_t end, int32_t code)
{
    Buf *o = c->out;
    c->spans++;
    if (put_i32(&o[S_LINE], line) < 0 || put_i64(&o[S_RESOURCE], c->resources - 1) < 0 ||
        put_i32(&o[S_KIND], kind) < 0 || put_u64(&o[S_START], start) < 0 || put_u64(&o[S_END], end) < 0 ||
        put_i32(&o[S_CODE], code) < 0 || put_offset(&o[S_TOFF], o[S_TDATA].len) < 0 ||
        put_offset(&o[S_SOFF], o[S_SDATA].len) < 0 || put_offset(&o[S_NOFF], o[S_NDATA].len) < 0 ||
        put_offset(&o[S_XOFF], o[S_XDATA].len) < 0)
        return -1;
    return cols_owner(&o[SPAN_POOL]);
}

/* Where an export starts, to roll it back when it is declined. */
typedef struct {
    size_t len[NBUFS];
    int64_t spans, resources;
} Mark;

static void
cols_mark(const Cols *c, Mark *m)
{
    for (int i = 0; i < NBUFS; i++)
        m->len[i] = c->out[i].len;
    m->spans = c->spans;
    m->resources = c->resources;
}

static void
cols_rollback(Cols *c, const Mark *m)
{
    for (int i = 0; i < NBUFS; i++)
        c->out[i].len = m->len[i];
    c->spans = m->spans;
    c->resources = m->resources;
}

/* Append `index` to the list of declined exports. */
static int
cols_decline(PyObject *declined, Py_ssize_t index)
{
    PyObject *i = PyLong_FromSsize_t(index);
    if (i == NULL || PyList_Append(declined, i) < 0) {
        Py_XDECREF(i);
        return -1;
    }
    Py_DECREF(i);
    return 0;
}

static Buf cols_kept[NBUFS + 1];

/* Keep the buffers for the next scan, unless they are past KEEP_BYTES in all (then free them). */
#define KEEP_BYTES ((size_t)256 << 20)

/* Start a scan with the kept buffers: every offsets column starts at 0. -1: a Python error. */
static int
cols_begin(Cols *c)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i <= NBUFS; i++) {
        Buf *b = i < NBUFS ? &c->out[i] : &c->scratch;
        *b = cols_kept[i];
        b->len = 0;
        cols_kept[i].data = NULL; /* (owned by this scan until cols_done hands them back) */
        cols_kept[i].cap = 0;
    }
    static const int OFFSETS[] = {S_TOFF, S_SOFF, S_NOFF, S_XOFF, SPAN_POOL + A_OWNERS, SPAN_POOL + A_KOFF,
                                  SPAN_POOL + A_TOFF, RES_POOL + A_OWNERS, RES_POOL + A_KOFF, RES_POOL + A_TOFF};
    for (size_t i = 0; i < sizeof OFFSETS / sizeof *OFFSETS; i++)
        if (put_i32(&c->out[OFFSETS[i]], 0) < 0)
            return -1;
    return 0;
}

static void
cols_done(Cols *c)
{
    size_t held = c->scratch.cap;
    for (int i = 0; i < NBUFS; i++)
        held += c->out[i].cap;
    for (int i = 0; i <= NBUFS; i++) {
        Buf *b = i < NBUFS ? &c->out[i] : &c->scratch;
        if (held > KEEP_BYTES) {
            PyMem_Free(b->data);
            b->data = NULL;
            b->cap = 0;
        }
        b->len = 0;
        cols_kept[i] = *b;
    }
}

static PyObject *
bytes_of(const Buf *b)
{
    return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

/* Arrow's bits (LSB first) of n one-byte flags into `bits` ((n + 7) / 8 bytes). */
static inline void
pack_bits(const unsigned char *v, size_t n, unsigned char *bits)
{
    memset(bits, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++)
        bits[i >> 3] |= (unsigned char)((v[i] != 0) << (i & 7));
}

/* Whether every one-byte flag of `b` is set. */
static inline int
all_set(const Buf *b)
{
    const unsigned char *v = (const unsigned char *)b->data;
    for (size_t i = 0; i < b->len; i++)
        if (!v[i])
            return 0;
    return 1;
}

/* Arrow's bits of a boolean column of one byte per element (always: the values, not a validity). */
static inline PyObject *
bits_of(const Buf *b)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((b->len + 7) / 8));
    if (out != NULL)
        pack_bits((const unsigned char *)b->data, b->len, (unsigned char *)PyBytes_AS_STRING(out));
    return out;
}

/* Arrow's validity bitmap of one byte per element; None when every element is valid. */
static PyObject *
bitmap_of(const Buf *b)
{
    if (all_set(b))
        Py_RETURN_NONE;
    return bits_of(b);
}

static PyObject *
pool_tuple(const Buf *pool)
{
    return Py_BuildValue("(nNNNNNNNNN)", (Py_ssize_t)(pool[A_OWNERS].len / 4 - 1), bytes_of(&pool[A_OWNERS]),
                         bytes_of(&pool[A_KOFF]), bytes_of(&pool[A_KDATA]), bitmap_of(&pool[A_VVALID]),
                         bitmap_of(&pool[A_TVALID]), bytes_of(&pool[A_TOFF]), bytes_of(&pool[A_TDATA]),
                         bitmap_of(&pool[A_IVALID]), bytes_of(&pool[A_IDATA]));
}

/* (declined, spans, resources, span columns..., span pool, resource pool): the tuple of _otlpjson.pyi. */
static PyObject *
cols_result(PyObject *declined, const Cols *c)
{
    const Buf *o = c->out;
    return Py_BuildValue("(OLLNNNNNNNNNNNNNNNN)", declined, (long long)c->spans, (long long)c->resources,
                         bytes_of(&o[S_LINE]), bytes_of(&o[S_RESOURCE]), bytes_of(&o[S_KIND]),
                         bytes_of(&o[S_START]), bytes_of(&o[S_END]), bytes_of(&o[S_CODE]), bytes_of(&o[S_TOFF]),
                         bytes_of(&o[S_TDATA]), bytes_of(&o[S_SOFF]), bytes_of(&o[S_SDATA]),
                         bytes_of(&o[S_NOFF]), bytes_of(&o[S_NDATA]), bytes_of(&o[S_XOFF]),
                         bytes_of(&o[S_XDATA]), pool_tuple(&o[SPAN_POOL]), pool_tuple(&o[RES_POOL]));
}

#endif
