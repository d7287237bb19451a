/* drainpipe.inputs._jsonscan: a block of JSON Lines request events -> Arrow column buffers, in one pass.
 *
 * Why C: pyarrow's JSON reader spent ~0.75 us per event (about 160 MB/s) on the benchmark's lines, most of a
 * worker's time and the main reason a file of JSON Lines was slower than DuckDB's read_json. The event schema is
 * fixed and flat, so one pass over the bytes can fill the columns directly at several hundred MB/s.
 *
 * It is a fast path, never the only one. It accepts only a strict subset of JSON whose meaning is beyond doubt
 * and returns None for anything else, and the caller then reads the block as before (pyarrow, else line by line):
 *   - every line is one object: it starts with '{', ends with '}' (an optional '\r' before the '\n'), and the
 *     block has exactly n lines;
 *   - keys are the seven field names of the event schema and the optional trace_id, each at most once, without
 *     escapes. An unknown field, a duplicate key or an escaped key declines (duplicates: json.loads keeps the
 *     last one, so declining keeps the per-line meaning without having to copy it);
 *   - whitespace between tokens is JSON's (space, tab, CR);
 *   - values: ts an integer within int64; latency_ms a JSON number; status true/false; the five strings
 *     without backslash escapes or control characters; any field may be null. A value of another JSON type
 *     (an ISO ts string, status 0/1, a number for a string) declines: the per-line rules decide those.
 * The caller has already checked that the block is UTF-8. Numbers are converted as json.loads + float() would
 * convert them, correctly rounded: an exact fast path when the digits fit 2^53 and the power of ten is exact
 * (Clinger's condition), else PyOS_string_to_double, which is what float() uses. An integer latency is the
 * integer's float, so "-0" is 0.0, as float(int("-0")) is.
 *
 * The result holds raw columns (nulls kept as nulls); the caller's columnar validation applies the event rules.
 *
 * Where the time goes (perf, ~0.14 us per 120-byte event): the byte loop itself. Keys are matched by their first
 * byte and one constant-size compare (a table of names cost a libc memcmp call per key: 16% of the time), and short
 * strings are copied as one fixed 16-byte move (a memcpy call per string: another 12%).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { F_TS, F_SERVICE, F_INSTANCE, F_ENDPOINT, F_LATENCY, F_STATUS, F_DB, F_TRACE, NFIELDS };
#define NSTRINGS 5 /* service, instance, endpoint, db_statement, trace_id */

static inline const unsigned char *
skip_ws(const unsigned char *p, const unsigned char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

/* Bytes that end the fast scan of a string: the closing quote, an escape, a control character (not JSON). */
static unsigned char STOP[256];

static void
init_stop(void)
{
    for (int c = 0; c < 0x20; c++)
        STOP[c] = 1;
    STOP['"'] = STOP['\\'] = 1;
}

/* The end of the string whose first byte is at p: the closing quote, or NULL to decline (an escape, a control
 * character, no closing quote). */
static inline const unsigned char *
string_end(const unsigned char *p, const unsigned char *end)
{
    while (p < end && !STOP[*p])
        p++;
    return p < end && *p == '"' ? p : NULL;
}

/* The field whose name starts at k (after its opening quote) and the byte after its closing quote, or -1. The
 * name and its closing quote are compared whole (constant-size compares, which the compiler inlines): an escaped
 * or unknown name never matches. */
static inline int
key_at(const unsigned char *k, const unsigned char *end, const unsigned char **after)
{
#define KEY(lit, field)                                                                                           \
    do {                                                                                                          \
        if (end - k >= (Py_ssize_t)sizeof(lit) - 1 && !memcmp(k, lit, sizeof(lit) - 1)) {                         \
            *after = k + sizeof(lit) - 1;                                                                         \
            return field;                                                                                         \
        }                                                                                                         \
        return -1;                                                                                                \
    } while (0)
    switch (*k) {
    case 't':
        if (end - k > 1 && k[1] == 'r')
            KEY("trace_id\"", F_TRACE);
        KEY("ts\"", F_TS);
    case 'i': KEY("instance\"", F_INSTANCE);
    case 'e': KEY("endpoint\"", F_ENDPOINT);
    case 'l': KEY("latency_ms\"", F_LATENCY);
    case 'd': KEY("db_statement\"", F_DB);
    case 's':
        if (end - k > 1 && k[1] == 'e')
            KEY("service\"", F_SERVICE);
        KEY("status\"", F_STATUS);
    default: return -1;
    }
#undef KEY
}

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

/* A JSON number at *pp -> *out (see the header for the conversion); 0, or 1 to decline. */
static int
parse_number(const unsigned char **pp, const unsigned char *end, double *out)
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
    *out = integer && v == 0.0 ? 0.0 : v; /* an integer's float has no negative zero: float(int("-0")) is 0.0 */
    return 0;
}

/* An integer within int64 at *pp; 0, or 1 to decline (not an integer, or too long). */
static int
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

static PyObject *
scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t n, start = 0;
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan(data, lines, start=0) takes 2 or 3 arguments");
        return NULL;
    }
    n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (nargs == 3 && (start = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    int64_t *ts = NULL;
    double *latency = NULL;
    uint8_t *status = NULL, *valid[NFIELDS] = {NULL};
    Py_ssize_t nulls[NFIELDS] = {0};
    StrCol str[NFIELDS];
    memset(str, 0, sizeof str);
    const int strings[NSTRINGS] = {F_SERVICE, F_INSTANCE, F_ENDPOINT, F_DB, F_TRACE};
    if (n <= 0 || start < 0 || start >= view.len || view.len - start >= INT32_MAX) /* int32 string offsets */
        goto decline;
    if (n > (view.len - start + 1) / 2) /* a line is at least "{}": no more rows than that */
        n = (view.len - start + 1) / 2;
    size_t bitmap = (size_t)(n + 7) / 8;
    ts = PyMem_Malloc((size_t)n * sizeof *ts);
    latency = PyMem_Malloc((size_t)n * sizeof *latency);
    status = PyMem_Calloc(bitmap, 1);
    if (!ts || !latency || !status)
        goto nomem;
    for (int f = 0; f < NFIELDS; f++)
        if (!(valid[f] = PyMem_Calloc(bitmap, 1)))
            goto nomem;
    for (int i = 0; i < NSTRINGS; i++) {
        StrCol *c = &str[strings[i]];
        if (!(c->offsets = PyMem_Malloc((size_t)(n + 1) * sizeof(int32_t))))
            goto nomem;
        c->offsets[0] = 0;
    }

    const unsigned char *p = (const unsigned char *)view.buf + start, *end = (const unsigned char *)view.buf + view.len;
    Py_ssize_t row = 0;
    while (p < end && row < n) {
        if (*p != '{')
            goto decline;
        ts[row] = 0;
        latency[row] = 0.0;
        unsigned seen = 0;
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}')
            p++;
        else
            for (;;) {
                if (p >= end || *p != '"')
                    goto decline;
                if (++p >= end)
                    goto decline;
                int f = key_at(p, end, &p);
                if (f < 0 || (seen & (1u << f)))
                    goto decline;
                seen |= 1u << f;
                p = skip_ws(p, end);
                if (p >= end || *p != ':')
                    goto decline;
                p = skip_ws(p + 1, end);
                if (p >= end)
                    goto decline;
                if (*p == 'n') {
                    if (end - p < 4 || memcmp(p, "null", 4))
                        goto decline;
                    p += 4;
                }
                else {
                    switch (f) {
                    case F_TS:
                        if (parse_int64(&p, end, &ts[row]))
                            goto decline;
                        break;
                    case F_LATENCY:
                        if (parse_number(&p, end, &latency[row]))
                            goto decline;
                        break;
                    case F_STATUS:
                        if (end - p >= 4 && !memcmp(p, "true", 4)) {
                            SET_BIT(status, row);
                            p += 4;
                        }
                        else if (end - p >= 5 && !memcmp(p, "false", 5))
                            p += 5;
                        else
                            goto decline;
                        break;
                    default: { /* a string */
                        if (*p != '"')
                            goto decline;
                        const unsigned char *s = ++p;
                        if (!(p = string_end(p, end)))
                            goto decline;
                        if (strcol_append(&str[f], s, (size_t)(p - s), end) < 0)
                            goto nomem;
                        p++;
                    }
                    }
                    SET_BIT(valid[f], row);
                }
                p = skip_ws(p, end);
                if (p >= end)
                    goto decline;
                if (*p == ',') {
                    p = skip_ws(p + 1, end);
                    continue;
                }
                if (*p != '}')
                    goto decline;
                p++;
                break;
            }
        if (p < end && *p == '\r')
            p++;
        if (p < end) {
            if (*p != '\n')
                goto decline;
            p++;
        }
        for (int i = 0; i < NSTRINGS; i++)
            str[strings[i]].offsets[row + 1] = (int32_t)str[strings[i]].len;
        row++;
    }
    for (int f = 0; f < NFIELDS; f++) { /* absent or null: the rows whose validity bit is not set */
        Py_ssize_t set = 0;
        for (Py_ssize_t i = 0; i < (row + 7) / 8; i++)
            set += __builtin_popcount(valid[f][i]);
        nulls[f] = row - set;
    }
    /* (end offset, lines, columns): per field (null count, validity bitmap or None, value buffers...), in the
     * event schema's order, then trace_id (text: validation decodes it); `lines` rows each */
    size_t filled = (size_t)(row + 7) / 8;
    PyObject *columns = PyTuple_New(NFIELDS);
    if (columns == NULL)
        goto done;
    for (int f = 0; f < NFIELDS; f++) {
        PyObject *validity = nulls[f] ? bytes_of(valid[f], filled) : Py_NewRef(Py_None);
        PyObject *col;
        if (f == F_TS)
            col = Py_BuildValue("(nNN)", nulls[f], validity, bytes_of(ts, (size_t)row * sizeof *ts));
        else if (f == F_LATENCY)
            col = Py_BuildValue("(nNN)", nulls[f], validity, bytes_of(latency, (size_t)row * sizeof *latency));
        else if (f == F_STATUS)
            col = Py_BuildValue("(nNN)", nulls[f], validity, bytes_of(status, filled));
        else
            col = Py_BuildValue("(nNNN)", nulls[f], validity,
                                bytes_of(str[f].offsets, (size_t)(row + 1) * sizeof(int32_t)),
                                bytes_of(str[f].data ? str[f].data : "", str[f].len));
        if (col == NULL) {
            Py_DECREF(columns);
            goto done;
        }
        PyTuple_SET_ITEM(columns, f, col);
    }
    result = Py_BuildValue("(nnN)", (Py_ssize_t)(p - (const unsigned char *)view.buf), row, columns);
    goto done;

nomem:
    PyErr_NoMemory();
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(ts);
    PyMem_Free(latency);
    PyMem_Free(status);
    for (int f = 0; f < NFIELDS; f++) {
        PyMem_Free(valid[f]);
        PyMem_Free(str[f].offsets);
        PyMem_Free(str[f].data);
    }
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(data, lines, start=0) -> (end, lines read, columns) | None: up to `lines` lines of data from offset "
     "`start` as Arrow column buffers, or None to decline."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "drainpipe.inputs._jsonscan",
    "A block of JSON Lines events -> Arrow column buffers (a strict fast path; see _jsonscan.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__jsonscan(void)
{
    init_stop();
    return PyModule_Create(&module);
}
