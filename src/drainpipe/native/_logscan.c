/* drainpipe.native._logscan: a block of access-log lines -> columns, in one pass, by the format's program.
 *
 * Why C: pyarrow reading the same lines with the format's regular expression (RE2, with captures) ran at about
 * 1 us per line, most of an access log's cost. A log format is a fixed sequence of literals and variables, each
 * variable ending at the first character of the literal after it, so one left-to-right pass cuts a line with no
 * backtracking, and converts the fields it needs on the way.
 *
 * It is a fast path, never the only one: it returns None for a block with a non-ASCII byte, and the format
 * compiler (log_formats.py) gives it a program only for what it reads exactly as the regular expression does
 * (a time in $time_local / %t form, a quoted $request / %r, a typed field never followed by a character its shape
 * could take). Every line it does not accept is flagged; the caller asks the per-line reference why.
 *
 * The program: (kind, text) steps; kind "lit" with the literal to match, else a role (as in log_formats.py) with
 * the character that ends the value ("" = the end of the line, trailing whitespace excluded), and per step
 * whether the value is in double quotes (backslash escapes are skipped over, as (?:[^"\\]|\\.)* does).
 *
 * Conversions are Python's, to the bit: numbers as float() converts them (an exact fast path when the digits fit
 * 2^53 and the power of ten is exact, else PyOS_string_to_double), then * 1000.0 or / 1000.0 as the unit says;
 * several upstream times summed left to right; times as calendar.timegm does (no check of the day against the
 * month's length, years 1..9999).
 *
 * Result: (good, blank, ts, latency, status, endpoint offsets, endpoint values, instance offsets, instance values)
 * as bytes to be read as numpy arrays (uint8, uint8, int64, float64, uint8) and Arrow string buffers (int32
 * offsets and values; the instance ones None when the format has no instance). The endpoint is "METHOD path" of
 * the request, its query cut off, its id segments written {id} when `ids` (endpoints.py's rule without user
 * rules; with them the caller normalizes each distinct raw endpoint). Lines not read give empty strings.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum role {
    R_LIT, R_SKIP, R_TS_CLF, R_REQUEST, R_STATUS, R_SECONDS, R_WHOLE_SECONDS, R_MILLIS, R_MICROS, R_AUTO_TIME,
    R_UPSTREAM, R_INSTANCE, R_UNKNOWN
};

typedef struct {
    int role;
    const char *text; /* the literal, or the stop character (empty: end of line) */
    Py_ssize_t len;
    int quoted;
} step_t;

static int
role_of(const char *s)
{
    static const struct { const char *name; int role; } names[] = {
        {"lit", R_LIT}, {"skip", R_SKIP}, {"ts_clf", R_TS_CLF}, {"request", R_REQUEST}, {"status", R_STATUS},
        {"seconds", R_SECONDS}, {"whole_seconds", R_WHOLE_SECONDS}, {"millis", R_MILLIS}, {"micros", R_MICROS},
        {"auto_time", R_AUTO_TIME}, {"upstream", R_UPSTREAM}, {"instance", R_INSTANCE},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i].name) == 0)
            return names[i].role;
    return R_UNKNOWN;
}

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14,
                               1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A number [0-9]+(\.[0-9]+)? at p (already checked), as float() reads it. */
static double
to_double(const unsigned char *p, const unsigned char *end)
{
    uint64_t m = 0;
    int digits = 0, frac = 0, dot = 0;
    for (const unsigned char *q = p; q < end; q++) {
        if (*q == '.') {
            dot = 1;
            continue;
        }
        if (digits < 19)
            m = m * 10 + (uint64_t)(*q - '0');
        digits++;
        frac += dot;
    }
    if (digits <= 19 && m < (1ULL << 53) && frac <= 22)
        return (double)m / POW10[frac];
    char buf[64];
    Py_ssize_t n = end - p;
    if (n >= (Py_ssize_t)sizeof(buf))
        return NAN; /* absurdly long: the caller flags the line, the reference gives the reason */
    memcpy(buf, p, (size_t)n);
    buf[n] = 0;
    double v = PyOS_string_to_double(buf, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NAN;
    }
    return v;
}

/* [0-9]+(\.[0-9]+)? from p: its end, or NULL. */
static const unsigned char *
number(const unsigned char *p, const unsigned char *end, int fraction)
{
    const unsigned char *q = p;
    while (q < end && is_digit(*q))
        q++;
    if (q == p)
        return NULL;
    if (fraction && q + 1 < end && *q == '.' && is_digit(q[1])) {
        q++;
        while (q < end && is_digit(*q))
            q++;
    }
    return q;
}

static const char MONTHS[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

/* days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil) */
static int64_t
days_from_civil(int64_t y, int64_t m, int64_t d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static inline int two(const unsigned char *p) { return (p[0] - '0') * 10 + (p[1] - '0'); }

/* dd/Mon/yyyy:HH:MM:SS +zzzz (26 bytes, shape checked by the caller) -> epoch ms; 0 and *ok = 0 when the
 * reference would not read it */
static int64_t
clf_ms(const unsigned char *p, int *ok)
{
    int mon = -1;
    for (int i = 0; i < 12; i++)
        if (memcmp(p + 3, MONTHS[i], 3) == 0)
            mon = i + 1;
    int day = two(p), year = two(p + 7) * 100 + two(p + 9), hh = two(p + 12), mm = two(p + 15), ss = two(p + 18);
    if (mon < 0 || day < 1 || day > 31 || hh > 23 || mm > 59 || ss > 60 || year < 1) {
        *ok = 0;
        return 0;
    }
    int64_t offset = ((int64_t)two(p + 22) * 60 + two(p + 24)) * 60 * (p[21] == '+' ? 1 : -1);
    int64_t seconds = days_from_civil(year, mon, 1) * 86400 + (int64_t)(day - 1) * 86400 + hh * 3600 + mm * 60 + ss;
    *ok = 1;
    return (seconds - offset) * 1000;
}

static int
clf_shape(const unsigned char *p, const unsigned char *end)
{
    static const char shape[] = "dd/Aaa/dddd:dd:dd:dd sdddd";
    if (end - p < 26)
        return 0;
    for (int i = 0; i < 26; i++) {
        char s = shape[i];
        unsigned char c = p[i];
        if (s == 'd' ? !is_digit(c)
            : s == 'A' ? !((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))
            : s == 'a' ? !((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))
            : s == 's' ? !(c == '+' || c == '-')
            : c != (unsigned char)s)
            return 0;
    }
    return 1;
}

/* (?:-|num)(?:(?:, | : )(?:-|num))* from p: its end (NULL if none), and the sum of the numbers in *sum (NAN when
 * every item is "-") */
static const unsigned char *
upstream(const unsigned char *p, const unsigned char *end, double *sum)
{
    double total = 0.0;
    int any = 0;
    const unsigned char *q = p;
    for (int first = 1;; first = 0) {
        const unsigned char *item = q;
        if (!first) {
            if (end - q >= 2 && q[0] == ',' && q[1] == ' ')
                item = q + 2;
            else if (end - q >= 3 && q[0] == ' ' && q[1] == ':' && q[2] == ' ')
                item = q + 3;
            else
                break;
        }
        const unsigned char *e;
        if (item < end && *item == '-') {
            e = item + 1;
        } else {
            e = number(item, end, 1);
            if (e == NULL)
                break;
            double x = to_double(item, e);
            if (isnan(x))
                return NULL; /* too long to read here: the reference reads the line */
            total += x;
            any = 1;
        }
        q = e;
    }
    if (q == p)
        return NULL;
    *sum = any ? total * 1000.0 : NAN;
    return q;
}

static inline int is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Whether a path segment is an id, as endpoints.py's _ID fullmatch says: digits, a UUID, or 16+ hex digits. */
static int
is_id(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t digits = 0, hex = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        digits += is_digit(p[i]);
        hex += is_hex(p[i]);
    }
    if (n > 0 && digits == n)
        return 1;
    if (hex == n && n >= 16)
        return 1;
    if (n != 36)
        return 0;
    for (Py_ssize_t i = 0; i < 36; i++)
        if ((i == 8 || i == 13 || i == 18 || i == 23) ? p[i] != '-' : !is_hex(p[i]))
            return 0;
    return 1;
}

/* A growing string column: int32 offsets and the values. */
typedef struct {
    int32_t *offsets;
    char *values;
    Py_ssize_t len, cap;
} strings_t;

static int
put(strings_t *c, const unsigned char *p, Py_ssize_t n)
{
    if (c->len + n > c->cap) {
        Py_ssize_t cap = c->cap * 2 + n + 1024;
        char *v = PyMem_Realloc(c->values, (size_t)cap);
        if (v == NULL)
            return -1;
        c->values = v;
        c->cap = cap;
    }
    memcpy(c->values + c->len, p, (size_t)n);
    c->len += n;
    return 0;
}

/* The endpoint "METHOD path" [p, p + n) into c, its id segments as {id} when ids (endpoints.py's rules without
 * user rules: only when the endpoint has a '/', every segment of the path after the space). */
static int
put_endpoint(strings_t *c, const unsigned char *p, Py_ssize_t n, int ids)
{
    const unsigned char *sp = memchr(p, ' ', (size_t)n);
    if (!ids || sp == NULL || memchr(sp, '/', (size_t)(p + n - sp)) == NULL)
        return put(c, p, n);
    if (put(c, p, sp + 1 - p) < 0)
        return -1;
    const unsigned char *q = sp + 1, *end = p + n;
    for (;;) {
        const unsigned char *slash = memchr(q, '/', (size_t)(end - q));
        const unsigned char *e = slash ? slash : end;
        if (e > q && is_id(q, e - q)) {
            if (put(c, (const unsigned char *)"{id}", 4) < 0)
                return -1;
        } else if (put(c, q, e - q) < 0) {
            return -1;
        }
        if (slash == NULL)
            return 0;
        if (put(c, slash, 1) < 0)
            return -1;
        q = slash + 1;
    }
}

typedef struct {
    int64_t ts;
    Py_ssize_t ep_start, ep_end, inst_start, inst_end;
    double latency, upstream;
    uint8_t status;
} row_t;

/* One line's content [p, end) (no '\n') by the program: 1 if it matches and gives a row, else 0. */
static int
scan_line(const step_t *prog, Py_ssize_t nsteps, const unsigned char *base, const unsigned char *p,
          const unsigned char *end, row_t *row)
{
    row->latency = row->upstream = NAN;
    row->status = 1;
    row->inst_start = row->inst_end = 0;
    int have_ts = 0, have_request = 0;
    for (Py_ssize_t s = 0; s < nsteps; s++) {
        const step_t *st = &prog[s];
        if (st->role == R_LIT) {
            if (end - p < st->len || memcmp(p, st->text, (size_t)st->len) != 0)
                return 0;
            p += st->len;
            continue;
        }
        const unsigned char *v = p, *e = NULL;
        switch (st->role) {
        case R_TS_CLF: {
            if (!clf_shape(p, end))
                return 0;
            e = p + 26;
            int ok;
            row->ts = clf_ms(p, &ok);
            if (!ok)
                return 0;
            have_ts = 1;
            break;
        }
        case R_STATUS:
            if (end - p < 3 || !is_digit(p[0]) || !is_digit(p[1]) || !is_digit(p[2]))
                return 0;
            e = p + 3;
            row->status = ((p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0')) < 500;
            break;
        case R_SECONDS: case R_WHOLE_SECONDS: case R_MILLIS: case R_MICROS: case R_AUTO_TIME: {
            if (p < end && *p == '-' && st->role != R_AUTO_TIME) {
                e = p + 1;
                break;
            }
            int fraction = st->role == R_SECONDS || st->role == R_AUTO_TIME;
            e = number(p, end, fraction);
            if (e == NULL)
                return 0;
            double x = to_double(p, e);
            if (isnan(x))
                return 0; /* a number too long to read here: the reference reads the line (NaN means "absent" below) */
            int dot = memchr(p, '.', (size_t)(e - p)) != NULL;
            if (st->role == R_MICROS || (st->role == R_AUTO_TIME && !dot))
                row->latency = x / 1000.0;
            else if (st->role == R_MILLIS)
                row->latency = x;
            else
                row->latency = x * 1000.0;
            break;
        }
        case R_UPSTREAM:
            e = upstream(p, end, &row->upstream);
            if (e == NULL)
                return 0;
            break;
        default: { /* skip, request, instance: up to the stop character */
            if (st->quoted) {
                const unsigned char *q = p;
                while (q < end && *q != '"') {
                    if (*q == '\\') {
                        if (q + 1 >= end)
                            return 0;
                        q += 2;
                    } else {
                        q++;
                    }
                }
                e = q;
            } else if (st->len == 0) {
                e = end;
                while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
                    e--;
            } else {
                const unsigned char *q = memchr(p, st->text[0], (size_t)(end - p));
                e = q ? q : end;
            }
            if (st->role == R_REQUEST) {
                const unsigned char *q = v;
                while (q < e && ((*q >= 'A' && *q <= 'Z') || (*q >= 'a' && *q <= 'z')))
                    q++;
                if (q == v || q >= e || *q != ' ')
                    return 0;
                q++;
                while (q < e && *q != ' ' && *q != '?')
                    q++;
                row->ep_start = v - base;
                row->ep_end = q - base;
                have_request = 1;
            } else if (st->role == R_INSTANCE && !(e - v == 1 && *v == '-')) {
                row->inst_start = v - base;
                row->inst_end = e - base;
            }
        }
        }
        p = e;
    }
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    if (p != end || !have_ts || !have_request)
        return 0;
    if (isnan(row->latency))
        row->latency = row->upstream;
    return !isnan(row->latency);
}

static PyObject *
strings_result(strings_t *c, Py_ssize_t count, PyObject **values)
{
    PyObject *offsets = PyBytes_FromStringAndSize((const char *)c->offsets, (count + 1) * 4);
    *values = PyBytes_FromStringAndSize(c->values ? c->values : "", c->len);
    if (offsets == NULL || *values == NULL) {
        Py_XDECREF(offsets);
        Py_CLEAR(*values);
        return NULL;
    }
    return offsets;
}

/* Whether every byte of [p, end) is ASCII, 32 bytes at a time (a byte at a time, this check took over a third of the
 * scan). */
static int
is_ascii(const unsigned char *p, const unsigned char *end)
{
    uint64_t w[4];
    for (; end - p >= 32; p += 32) {
        memcpy(w, p, 32);
        if ((w[0] | w[1] | w[2] | w[3]) & 0x8080808080808080ull)
            return 0;
    }
    for (; p < end; p++)
        if (*p & 0x80)
            return 0;
    return 1;
}

static PyObject *
scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer buf;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "scan(data, count, program, quoted, ids)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count < 0 && PyErr_Occurred())
        return NULL;
    PyObject *program = args[2], *quoted = args[3];
    int ids = PyObject_IsTrue(args[4]);
    if (!PyTuple_Check(program) || !PyTuple_Check(quoted) || PyTuple_GET_SIZE(program) != PyTuple_GET_SIZE(quoted)) {
        PyErr_SetString(PyExc_TypeError, "program and quoted must be tuples of one length");
        return NULL;
    }
    Py_ssize_t nsteps = PyTuple_GET_SIZE(program);
    step_t *prog = PyMem_Calloc((size_t)nsteps + 1, sizeof(step_t));
    if (prog == NULL)
        return PyErr_NoMemory();
    int has_instance = 0;
    for (Py_ssize_t i = 0; i < nsteps; i++) {
        PyObject *st = PyTuple_GET_ITEM(program, i);
        if (!PyTuple_Check(st) || PyTuple_GET_SIZE(st) != 2) {
            PyMem_Free(prog);
            PyErr_SetString(PyExc_TypeError, "a step is (kind, text)");
            return NULL;
        }
        const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(st, 0));
        Py_ssize_t len;
        const char *text = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(st, 1), &len);
        if (kind == NULL || text == NULL) {
            PyMem_Free(prog);
            return NULL;
        }
        prog[i].role = role_of(kind);
        prog[i].text = text;
        prog[i].len = len;
        prog[i].quoted = PyObject_IsTrue(PyTuple_GET_ITEM(quoted, i));
        if (prog[i].role == R_UNKNOWN) {
            PyMem_Free(prog);
            Py_RETURN_NONE;
        }
        has_instance |= prog[i].role == R_INSTANCE;
    }
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0) {
        PyMem_Free(prog);
        return NULL;
    }
    const unsigned char *data = buf.buf, *end = data + buf.len;
    if (!is_ascii(data, end)) { /* pyarrow checks UTF-8 and reads it */
        PyBuffer_Release(&buf);
        PyMem_Free(prog);
        Py_RETURN_NONE;
    }
    PyObject *out[9] = {NULL};
    Py_ssize_t sizes[5] = {1, 1, 8, 8, 1};
    strings_t eps = {0}, insts = {0};
    eps.offsets = PyMem_Calloc((size_t)count + 1, 4);
    insts.offsets = has_instance ? PyMem_Calloc((size_t)count + 1, 4) : NULL;
    if (eps.offsets == NULL || (has_instance && insts.offsets == NULL)) {
        PyErr_NoMemory();
        goto fail;
    }
    for (int i = 0; i < 5; i++) {
        out[i] = PyBytes_FromStringAndSize(NULL, count * sizes[i]);
        if (out[i] == NULL)
            goto fail;
    }
    uint8_t *good = (uint8_t *)PyBytes_AS_STRING(out[0]), *blank = (uint8_t *)PyBytes_AS_STRING(out[1]);
    int64_t *ts = (int64_t *)PyBytes_AS_STRING(out[2]);
    double *lat = (double *)PyBytes_AS_STRING(out[3]);
    uint8_t *status = (uint8_t *)PyBytes_AS_STRING(out[4]);
    const unsigned char *p = data;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
        const unsigned char *le = nl ? nl : end;
        int is_blank = 1;
        for (const unsigned char *q = p; q < le; q++)
            if (!(*q == ' ' || *q == '\t' || *q == '\r' || *q == '\f' || *q == '\v')) {
                is_blank = 0;
                break;
            }
        row_t row = {0};
        int ok = !is_blank && scan_line(prog, nsteps, data, p, le, &row);
        good[i] = (uint8_t)ok;
        blank[i] = (uint8_t)is_blank;
        ts[i] = ok ? row.ts : 0;
        lat[i] = ok ? row.latency : NAN;
        status[i] = row.status;
        if (ok && put_endpoint(&eps, data + row.ep_start, row.ep_end - row.ep_start, ids) < 0)
            goto nomem;
        if (eps.len > INT32_MAX)
            goto nomem;
        eps.offsets[i + 1] = (int32_t)eps.len;
        if (has_instance) {
            if (ok && put(&insts, data + row.inst_start, row.inst_end - row.inst_start) < 0)
                goto nomem;
            if (insts.len > INT32_MAX)
                goto nomem;
            insts.offsets[i + 1] = (int32_t)insts.len;
        }
        p = nl ? nl + 1 : end;
    }
    out[5] = strings_result(&eps, count, &out[6]);
    if (out[5] == NULL)
        goto fail;
    if (has_instance) {
        out[7] = strings_result(&insts, count, &out[8]);
        if (out[7] == NULL)
            goto fail;
    }
    PyObject *result = PyTuple_New(9);
    if (result == NULL)
        goto fail;
    for (int i = 0; i < 9; i++) {
        if (out[i] == NULL) {
            Py_INCREF(Py_None);
            out[i] = Py_None;
        }
        PyTuple_SET_ITEM(result, i, out[i]);
        out[i] = NULL; /* the tuple holds it now */
    }
    goto done;
nomem:
    PyErr_NoMemory();
fail:
    result = NULL;
done:
    PyBuffer_Release(&buf);
    PyMem_Free(prog);
    PyMem_Free(eps.offsets);
    PyMem_Free(eps.values);
    PyMem_Free(insts.offsets);
    PyMem_Free(insts.values);
    for (int i = 0; i < 9; i++)
        Py_XDECREF(out[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(data, count, program, quoted, ids) -> columns | None: `count` lines of an access log read by the format's "
     "program, or None to decline (see _logscan.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "drainpipe.native._logscan",
    "A block of access-log lines -> columns, by the format's program (a fast path; see _logscan.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__logscan(void)
{
    return PyModule_Create(&module);
}
