/* drainpipe.inputs: what the C scanners of request events share (included by _jsonscan.c and _csvscan.c).
 *
 * A scanner fills the event fields' columns as Arrow buffers, row by row, and hands them to Python as
 * (null count, validity bitmap or None, value buffers...) per field, in the event schema's order, then trace_id as
 * text (validation decodes it): ts int64, the strings int32 offsets and data, latency_ms float64, status a bitmap.
 * Nulls are kept as nulls; the caller's columnar validation applies the event rules. Numbers are parsed as JSON
 * numbers (the grammar of both formats' number cells), converted as Python converts them.
 */
#ifndef DRAINPIPE_COLUMNS_H
#define DRAINPIPE_COLUMNS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { F_TS, F_SERVICE, F_INSTANCE, F_ENDPOINT, F_LATENCY, F_STATUS, F_DB, F_TRACE, NFIELDS };
#define NSTRINGS 5 /* service, instance, endpoint, db_statement, trace_id */
static const int STRING_FIELDS[NSTRINGS] = {F_SERVICE, F_INSTANCE, F_ENDPOINT, F_DB, F_TRACE};

static inline int
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* A string column: Arrow's int32 offsets and a growing data buffer. */
typedef struct {
    int32_t *offsets;
    char *data;
    size_t len, cap;
} StrCol;

/* Append the n bytes at s (readable up to limit). Short strings, the usual case, are copied as one fixed
 * 16-byte move (the buffer keeps 16 bytes of slack for it) instead of a call to memcpy. */
static inline int
strcol_append(StrCol *c, const unsigned char *s, size_t n, const unsigned char *limit)
{
    if (c->len + n + 16 > c->cap) {
        size_t cap = c->cap ? c->cap : 4096;
        while (cap < c->len + n + 16)
            cap *= 2;
        char *data = PyMem_Realloc(c->data, cap);
        if (data == NULL)
            return -1;
        c->data = data;
        c->cap = cap;
    }
    if (n <= 16 && limit - s >= 16)
        memcpy(c->data + c->len, s, 16);
    else
        memcpy(c->data + c->len, s, n);
    c->len += n;
    return 0;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The sign and integer part's first digit of a JSON number at *pp: *neg set, *pp moved to that digit; 1 to decline
 * (no digit, or a leading zero followed by a digit: not JSON). */
static inline int
number_start(const unsigned char **pp, const unsigned char *end, int *neg)
{
    const unsigned char *p = *pp;
    *neg = *p == '-';
    p += *neg;
    if (p >= end || !is_digit(*p) || (*p == '0' && p + 1 < end && is_digit(p[1])))
        return 1;
    *pp = p;
    return 0;
}

/* A JSON number at *pp -> *out, correctly rounded: an exact fast path when the digits fit 2^53 and the power of ten
 * is exact (Clinger's condition), else PyOS_string_to_double, which is what float() uses. `json_int`: an integer
 * converts as json.loads + float() convert it, so "-0" is 0.0 (float(int("-0"))); without it as float("-0") does,
 * -0.0. 0, or 1 to decline. */
static inline int
parse_number(const unsigned char **pp, const unsigned char *end, double *out, int json_int)
{
    const unsigned char *p = *pp, *start = p;
    int neg, integer = 1, exact = 1;
    uint64_t m = 0;   /* the significant digits, at most 19 of them */
    int digits = 0;   /* digits in m, counted from the first non-zero one */
    int64_t e10 = 0;  /* the value is m * 10^e10 (if exact) */
    if (number_start(&p, end, &neg))
        return 1;
    if (*p == '0')
        p++;
    else
        for (; p < end && is_digit(*p); p++) {
            if (digits < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                digits++;
            }
            else {
                e10++;
                exact = 0;
            }
        }
    if (p < end && *p == '.') {
        integer = 0;
        p++;
        if (p >= end || !is_digit(*p))
            return 1;
        for (; p < end && is_digit(*p); p++) {
            if (digits < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                e10--;
                if (m)
                    digits++;
            }
            else
                exact = 0;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        int64_t e = 0;
        integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        if (p >= end || !is_digit(*p))
            return 1;
        for (; p < end && is_digit(*p); p++)
            if (e < 100000)
                e = e * 10 + (*p - '0');
        e10 += eneg ? -e : e;
    }
    *pp = p;
    double v;
    if (exact && m <= ((uint64_t)1 << 53) && e10 >= -22 && e10 <= 22) {
        v = e10 < 0 ? (double)m / POW10[-e10] : (double)m * POW10[e10];
        v = neg ? -v : v;
    }
    else {
        /* Rare: long mantissas or large exponents; the same correctly rounded conversion float() makes. */
        char buf[128];
        size_t n = (size_t)(p - start);
        if (n >= sizeof buf)
            return 1;
        memcpy(buf, start, n);
        buf[n] = '\0';
        v = PyOS_string_to_double(buf, NULL, NULL);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 1;
        }
    }
    *out = json_int && integer && v == 0.0 ? 0.0 : v;
    return 0;
}

/* An integer within int64 at *pp; 0, or 1 to decline (not an integer, or too long). */
static inline int
parse_int64(const unsigned char **pp, const unsigned char *end, int64_t *out)
{
    const unsigned char *p = *pp;
    int neg, digits = 0;
    uint64_t v = 0;
    if (number_start(&p, end, &neg))
        return 1;
    if (*p == '0')
        p++;
    else {
        while (p < end && is_digit(*p)) {
            if (++digits > 18) /* 18 digits always fit int64; longer values are not timestamps anyway */
                return 1;
            v = v * 10 + (uint64_t)(*p - '0');
            p++;
        }
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return 1; /* a float ts: the per-line rules reject it with their reason */
    *pp = p;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

#define SET_BIT(bits, i) ((bits)[(i) >> 3] |= (uint8_t)(1u << ((i) & 7)))

static PyObject *
bytes_of(const void *p, size_t n)
{
    return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
}

/* The columns of up to `rows` rows being filled. */
typedef struct {
    int64_t *ts;
    double *latency;
    uint8_t *status, *valid[NFIELDS];
    StrCol str[NFIELDS];
} Columns;

/* Zeroed columns for up to `rows` rows; 0, or -1 with MemoryError set (free them with columns_free either way). */
static int
columns_alloc(Columns *c, Py_ssize_t rows)
{
    memset(c, 0, sizeof *c);
    size_t bitmap = (size_t)(rows + 7) / 8;
    c->ts = PyMem_Malloc((size_t)rows * sizeof *c->ts);
    c->latency = PyMem_Malloc((size_t)rows * sizeof *c->latency);
    c->status = PyMem_Calloc(bitmap, 1);
    if (!c->ts || !c->latency || !c->status)
        goto nomem;
    for (int f = 0; f < NFIELDS; f++)
        if (!(c->valid[f] = PyMem_Calloc(bitmap, 1)))
            goto nomem;
    for (int i = 0; i < NSTRINGS; i++) {
        StrCol *s = &c->str[STRING_FIELDS[i]];
        if (!(s->offsets = PyMem_Malloc((size_t)(rows + 1) * sizeof(int32_t))))
            goto nomem;
        s->offsets[0] = 0;
    }
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

/* Row `row` is complete: its strings end here (a null or absent one is empty). */
static inline void
columns_row_done(Columns *c, Py_ssize_t row)
{
    for (int i = 0; i < NSTRINGS; i++)
        c->str[STRING_FIELDS[i]].offsets[row + 1] = (int32_t)c->str[STRING_FIELDS[i]].len;
}

/* The columns of the first `rows` rows as Python values (see the top), or NULL with an exception set. */
static PyObject *
columns_result(const Columns *c, Py_ssize_t rows)
{
    size_t filled = (size_t)(rows + 7) / 8;
    PyObject *columns = PyTuple_New(NFIELDS);
    if (columns == NULL)
        return NULL;
    for (int f = 0; f < NFIELDS; f++) {
        Py_ssize_t set = 0; /* absent or null: the rows whose validity bit is not set */
        for (size_t i = 0; i < filled; i++)
            set += __builtin_popcount(c->valid[f][i]);
        Py_ssize_t nulls = rows - set;
        PyObject *validity = nulls ? bytes_of(c->valid[f], filled) : Py_NewRef(Py_None);
        PyObject *col;
        if (f == F_TS)
            col = Py_BuildValue("(nNN)", nulls, validity, bytes_of(c->ts, (size_t)rows * sizeof *c->ts));
        else if (f == F_LATENCY)
            col = Py_BuildValue("(nNN)", nulls, validity, bytes_of(c->latency, (size_t)rows * sizeof *c->latency));
        else if (f == F_STATUS)
            col = Py_BuildValue("(nNN)", nulls, validity, bytes_of(c->status, filled));
        else
            col = Py_BuildValue("(nNNN)", nulls, validity,
                                bytes_of(c->str[f].offsets, (size_t)(rows + 1) * sizeof(int32_t)),
                                bytes_of(c->str[f].data ? c->str[f].data : "", c->str[f].len));
        if (col == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyTuple_SET_ITEM(columns, f, col);
    }
    return columns;
}

static void
columns_free(Columns *c)
{
    PyMem_Free(c->ts);
    PyMem_Free(c->latency);
    PyMem_Free(c->status);
    for (int f = 0; f < NFIELDS; f++) {
        PyMem_Free(c->valid[f]);
        PyMem_Free(c->str[f].offsets);
        PyMem_Free(c->str[f].data);
    }
}

#endif /* DRAINPIPE_COLUMNS_H */
