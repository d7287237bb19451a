/* drainpipe.native._jsonscan: a block of JSON Lines request events -> Arrow column buffers, in one pass.
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
 * convert them (_columns.h): an integer latency is the integer's float, so "-0" is 0.0, as float(int("-0")) is.
 *
 * The result holds raw columns (_columns.h: nulls kept as nulls); the caller's columnar validation applies the
 * event rules.
 *
 * Where the time goes (perf, ~0.14 us per 120-byte event): the byte loop itself. Keys are matched by their first
 * byte and one constant-size compare (a table of names cost a libc memcmp call per key: 16% of the time), and short
 * strings are copied as one fixed 16-byte move (a memcpy call per string: another 12%).
 */
#include "_columns.h"

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
    Columns c;
    memset(&c, 0, sizeof c);
    if (n <= 0 || start < 0 || start >= view.len || view.len - start >= INT32_MAX) /* int32 string offsets */
        goto decline;
    if (n > (view.len - start + 1) / 2) /* a line is at least "{}": no more rows than that */
        n = (view.len - start + 1) / 2;
    if (columns_alloc(&c, n) < 0)
        goto done;

    const unsigned char *p = (const unsigned char *)view.buf + start, *end = (const unsigned char *)view.buf + view.len;
    Py_ssize_t row = 0;
    while (p < end && row < n) {
        if (*p != '{')
            goto decline;
        c.ts[row] = 0;
        c.latency[row] = 0.0;
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
                        if (parse_int64(&p, end, &c.ts[row]))
                            goto decline;
                        break;
                    case F_LATENCY:
                        if (parse_number(&p, end, &c.latency[row], 1))
                            goto decline;
                        break;
                    case F_STATUS:
                        if (end - p >= 4 && !memcmp(p, "true", 4)) {
                            SET_BIT(c.status, row);
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
                        if (columns_string(&c, f, row, s, (size_t)(p - s), end) < 0)
                            goto nomem;
                        p++;
                    }
                    }
                    SET_BIT(c.valid[f], row);
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
        columns_row_done(&c, row);
        row++;
    }
    /* (end offset, lines, columns) */
    PyObject *columns = columns_result(&c, row);
    if (columns != NULL)
        result = Py_BuildValue("(nnN)", (Py_ssize_t)(p - (const unsigned char *)view.buf), row, columns);
    goto done;

nomem:
    PyErr_NoMemory();
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    columns_free(&c);
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
    PyModuleDef_HEAD_INIT, "drainpipe.native._jsonscan",
    "A block of JSON Lines events -> Arrow column buffers (a strict fast path; see _jsonscan.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__jsonscan(void)
{
    init_stop();
    return PyModule_Create(&module);
}
