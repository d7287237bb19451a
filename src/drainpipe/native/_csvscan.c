/* drainpipe.native._csvscan: where the records of a CSV block end, and whether they are well-formed, in one pass.
 *
 * Why C: planning a CSV file into parts (and reading one) needs its record boundaries: the newlines outside quoted
 * fields. numpy found them from the quote parity at ~300 MB/s with its temporaries (every string field quoted, as
 * pyarrow and many tools write it, is ~100k quotes per MB), and the planner's scan became the slowest step of a
 * whole run. A byte-at-a-time state machine did it at ~250 MB/s, still a third of a CSV run's CPU (the planner
 * and the workers each scan every byte). This pass works on 64 bytes at a time as bit masks (one bit per byte:
 * quotes, newlines, commas, carriage returns; SSE2 compares build them), the way simdjson and simdcsv do: the
 * bytes inside quotes are the prefix XOR of the quote mask, and every rule below is a few mask operations.
 *
 * Well-formed is RFC 4180 as Python's strict csv reader takes it, the rule csv_format.py's numpy check
 * (_well_formed) also applies: a quoted field opens at a field's start and closes before a comma or the record's
 * end, "" inside it is a quote; an unquoted field has no quote and no carriage return; a carriage return outside
 * quotes is followed by a newline. In masks, with `in` the prefix XOR of the quotes (set from an opening quote up
 * to, not including, its closing one), `open` = quotes & in and `close` = quotes & ~in:
 *   - an opening quote follows a comma, a newline, a closing quote ("" inside a field) or starts the data;
 *   - the byte after a closing quote is a comma, a newline, a carriage return or a quote;
 *   - the byte after a carriage return outside quotes is a newline.
 * A violation is found at a byte of the record that is not well-formed, never at the newline ending an earlier
 * record. Before the first violation the parity is exactly the quoted state of the reader, so the record ends are
 * the newlines outside quotes.
 *
 * scan(data, begin, records, final) -> (ends, lines, malformed)
 *   ends: the offsets just after the record-ending newlines from `begin`, at most `records` of them, as int64
 *   bytes; lines: the newlines from `begin` to the last end (quoted ones included); malformed: True if the record
 *   after the last end is not well-formed (with `final`, the data ends the file, so a record left in quotes or in
 *   a carriage return is not). Scanning stops there: every record before the last end is well-formed.
 *
 * columns(data, fields, records, begin) -> (end, rows, lines, columns) | None
 *   The cells of up to `records` well-formed records from offset `begin` typed into the event fields' columns
 *   (_columns.h), in one pass: what the columnar path did with pyarrow's CSV reader and a dozen compute kernels (half
 *   of a CSV worker's time). It finds the records' ends on the way, so a worker reading a planned range (whose
 *   records the planner checked) needs no record scan of its own. end: the offset after the last record read (after
 *   its newline); rows: the records read (fewer than `records` only at the data's end); lines: the newlines read
 *   (quoted ones included). `fields` gives, per CSV column, the event field it feeds (F_* of _columns.h; at most one
 *   column a field) or 255 (a column no field reads, or a later duplicate: the first column of a name wins). Cells
 *   are typed as the reference types them (csv_format._csv_typer): an empty cell is null; ts an integer (JSON
 *   syntax, at most 18 digits); latency_ms a JSON number, converted as float() converts its text ("-0" is -0.0);
 *   status true/1/false/0; strings as they are (quoted ones unquoted, "" as "). It declines (None) whatever the
 *   reference decides otherwise or rejects: a cell of another form (an ISO ts, "TRUE"), a record with another number
 *   of cells (blank lines included), a quote out of place. The caller has checked the data is UTF-8.
 */
#include "_columns.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct {
    uint64_t quote, newline, comma, carriage;
} Masks;

/* the masks of 64 bytes at p (bit i: byte i) */
static inline Masks
masks_of(const unsigned char *p)
{
    Masks m;
#ifdef __SSE2__
    const __m128i q = _mm_set1_epi8('"'), nl = _mm_set1_epi8('\n'), c = _mm_set1_epi8(','), cr = _mm_set1_epi8('\r');
    uint64_t mq = 0, mnl = 0, mc = 0, mcr = 0;
    for (int k = 0; k < 4; k++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 * k));
        mq |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, q)) << (16 * k);
        mnl |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, nl)) << (16 * k);
        mc |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, c)) << (16 * k);
        mcr |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, cr)) << (16 * k);
    }
    m.quote = mq, m.newline = mnl, m.comma = mc, m.carriage = mcr;
#else
    m.quote = m.newline = m.comma = m.carriage = 0;
    for (int k = 0; k < 64; k++) {
        uint64_t bit = (uint64_t)1 << k;
        m.quote |= p[k] == '"' ? bit : 0;
        m.newline |= p[k] == '\n' ? bit : 0;
        m.comma |= p[k] == ',' ? bit : 0;
        m.carriage |= p[k] == '\r' ? bit : 0;
    }
#endif
    return m;
}

static inline uint64_t
prefix_xor(uint64_t x)
{
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    return x;
}

static inline int
popcount64(uint64_t x)
{
    return __builtin_popcountll(x);
}

static PyObject *
scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scan(data, begin, records, final)");
        return NULL;
    }
    Py_buffer buf;
    Py_ssize_t begin = PyLong_AsSsize_t(args[1]), records = PyLong_AsSsize_t(args[2]);
    if ((begin == -1 || records == -1) && PyErr_Occurred())
        return NULL;
    int final = PyObject_IsTrue(args[3]);
    if (final < 0)
        return NULL;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    if (begin < 0 || begin > buf.len || records < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "begin or records out of range");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (records < 1 ? 1 : records) * 8);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    int64_t *ends = (int64_t *)PyBytes_AS_STRING(out);
    const unsigned char *p = (const unsigned char *)buf.buf;
    const Py_ssize_t n = buf.len;
    Py_ssize_t found = 0, lines = 0, newlines = 0; /* newlines: before the current chunk */
    int malformed = 0;
    /* carried from the byte before the chunk: inside quotes; a comma, newline or closing quote (an opening quote
     * may follow: the data's start counts as one); a closing quote; a carriage return outside quotes */
    uint64_t inside = 0, may_open = 1, closed = 0, returned = 0, last_in = 0, last_returned = 0;
    unsigned char tail[64];
    for (Py_ssize_t base = begin; base < n && found < records; base += 64) {
        Py_ssize_t avail = n - base;
        uint64_t valid = avail >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << avail) - 1);
        Masks m;
        if (avail >= 64) {
            m = masks_of(p + base);
        } else { /* the last bytes, padded (the padding is outside `valid`) */
            memset(tail, 'x', sizeof tail);
            memcpy(tail, p + base, (size_t)avail);
            m = masks_of(tail);
        }
        m.quote &= valid, m.newline &= valid, m.comma &= valid, m.carriage &= valid;
        uint64_t in = prefix_xor(m.quote) ^ (inside ? ~(uint64_t)0 : 0);
        uint64_t open = m.quote & in, close = m.quote & ~in, cr_out = m.carriage & ~in;
        uint64_t opener = m.comma | m.newline | close;
        uint64_t err = (open & ~((opener << 1) | may_open))
                     | (((close << 1) | closed) & ~(m.comma | m.newline | m.carriage | m.quote))
                     | (((cr_out << 1) | returned) & ~m.newline);
        err &= valid;
        uint64_t record_ends = m.newline & ~in;
        uint64_t before_err = err ? (((uint64_t)1 << __builtin_ctzll(err)) - 1) : ~(uint64_t)0;
        uint64_t todo = record_ends & before_err;
        while (todo && found < records) {
            int bit = __builtin_ctzll(todo);
            ends[found++] = (int64_t)(base + bit + 1);
            lines = newlines + popcount64(m.newline & (bit == 63 ? ~(uint64_t)0 : (((uint64_t)2 << bit) - 1)));
            todo &= todo - 1;
        }
        if (found >= records)
            break;
        if (err) {
            malformed = 1;
            break;
        }
        newlines += popcount64(m.newline);
        int top = avail >= 64 ? 63 : (int)avail - 1;
        last_in = (in >> top) & 1;
        last_returned = (cr_out >> top) & 1;
        inside = (in >> 63) & 1;
        may_open = (opener >> 63) & 1;
        closed = (close >> 63) & 1;
        returned = (cr_out >> 63) & 1;
    }
    if (final && !malformed && found < records && n > begin && (last_in || last_returned))
        malformed = 1; /* the file ends inside quotes, or in a carriage return */
    PyBuffer_Release(&buf);
    if (_PyBytes_Resize(&out, found * 8) < 0)
        return NULL;
    return Py_BuildValue("(NnO)", out, lines, malformed ? Py_True : Py_False);
}

/* One cell: its bytes [s, s + n), quoted with "" escapes inside when `escaped`. */
typedef struct {
    const unsigned char *s;
    size_t n;
    int escaped;
    Py_ssize_t newlines; /* inside its quotes */
} Cell;

/* The cell starting at *pp, *pp moved to its delimiter (a comma, a newline, a carriage return, the end); 0, or 1
 * to decline (a quote out of place, a carriage return alone, a quoted cell not closed). */
static inline int
cell_at(const unsigned char **pp, const unsigned char *end, Cell *cell)
{
    const unsigned char *p = *pp;
    cell->escaped = 0;
    cell->newlines = 0;
    if (p < end && *p == '"') {
        const unsigned char *s = ++p;
        for (;;) {
            const unsigned char *q = memchr(p, '"', (size_t)(end - p));
            if (q == NULL)
                return 1;
            if (q + 1 < end && q[1] == '"') { /* "" inside: a quote */
                cell->escaped = 1;
                p = q + 2;
                continue;
            }
            cell->s = s, cell->n = (size_t)(q - s);
            for (const unsigned char *nl = s; (nl = memchr(nl, '\n', (size_t)(q - nl))) != NULL; nl++)
                cell->newlines++;
            p = q + 1;
            break;
        }
    }
    else {
        cell->s = p;
        while (p < end && *p != ',' && *p != '\n' && *p != '\r') {
            if (*p == '"')
                return 1;
            p++;
        }
        cell->n = (size_t)(p - cell->s);
    }
    if (p < end && *p == '\r' && (p + 1 >= end || p[1] != '\n'))
        return 1;
    if (p < end && *p != ',' && *p != '\n' && *p != '\r')
        return 1;
    *pp = p;
    return 0;
}

/* A string cell into row `row` of field f (unescaped first into `scratch`, when it holds ""); 0, or -1 with
 * MemoryError set. */
static inline int
append_cell(Columns *c, int f, Py_ssize_t row, const Cell *cell, const unsigned char *limit, StrCol *scratch)
{
    if (!cell->escaped)
        return columns_string(c, f, row, cell->s, cell->n, limit);
    scratch->len = 0;
    for (size_t i = 0; i < cell->n; i++) {
        if (strcol_append(scratch, cell->s + i, 1, cell->s + i + 1) < 0)
            return -1;
        if (cell->s[i] == '"')
            i++; /* the second of "" */
    }
    const unsigned char *s = (const unsigned char *)scratch->data;
    return columns_string(c, f, row, s, scratch->len, s + scratch->len);
}

/* A typed cell into row `row` of field `f`; 0, 1 to decline, -1 with MemoryError set. */
static inline int
set_cell(Columns *c, int f, Py_ssize_t row, const Cell *cell, const unsigned char *limit, StrCol *scratch)
{
    const unsigned char *s = cell->s, *e = cell->s + cell->n;
    if (cell->n == 0)
        return 0; /* empty: null (the validity bit stays clear) */
    switch (f) {
    case F_TS:
        if (cell->escaped || parse_int64(&s, e, &c->ts[row]) || s != e)
            return 1;
        break;
    case F_LATENCY:
        if (cell->escaped || parse_number(&s, e, &c->latency[row], 0) || s != e)
            return 1;
        break;
    case F_STATUS:
        if ((cell->n == 4 && !memcmp(s, "true", 4)) || (cell->n == 1 && *s == '1'))
            SET_BIT(c->status, row);
        else if (!((cell->n == 5 && !memcmp(s, "false", 5)) || (cell->n == 1 && *s == '0')))
            return 1;
        break;
    default:
        if (append_cell(c, f, row, cell, limit, scratch) < 0)
            return -1;
    }
    SET_BIT(c->valid[f], row);
    return 0;
}

static PyObject *
columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "columns(data, fields, records, begin)");
        return NULL;
    }
    Py_ssize_t records = PyLong_AsSsize_t(args[2]), begin = PyLong_AsSsize_t(args[3]);
    if ((records == -1 || begin == -1) && PyErr_Occurred())
        return NULL;
    Py_buffer buf, map;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &map, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    PyObject *result = NULL;
    Columns c;
    memset(&c, 0, sizeof c);
    StrCol scratch = {0}; /* an escaped cell, unescaped */
    const unsigned char *fields = map.buf;
    Py_ssize_t width = map.len, row = 0, lines = 0;
    if (records <= 0 || width <= 0 || begin < 0 || begin >= buf.len || buf.len - begin >= INT32_MAX)
        goto decline; /* (int32 string offsets) */
    unsigned mapped = 0; /* a field fed by two columns is declined: each field holds one value a row */
    for (Py_ssize_t i = 0; i < width; i++)
        if (fields[i] != 255) {
            if (fields[i] >= NFIELDS || (mapped & (1u << fields[i])))
                goto decline;
            mapped |= 1u << fields[i];
        }
    if (columns_alloc(&c, records) < 0)
        goto done;
    const unsigned char *p = (const unsigned char *)buf.buf + begin, *end = (const unsigned char *)buf.buf + buf.len;
    while (p < end && row < records) {
        c.ts[row] = 0;
        c.latency[row] = 0.0;
        for (Py_ssize_t col = 0;; col++) {
            Cell cell;
            if (col == width || cell_at(&p, end, &cell))
                goto decline;
            lines += cell.newlines;
            if (fields[col] != 255) {
                int r = set_cell(&c, fields[col], row, &cell, end, &scratch);
                if (r < 0)
                    goto done;
                if (r)
                    goto decline;
            }
            if (p < end && *p == ',') {
                p++;
                continue;
            }
            if (col + 1 != width)
                goto decline;
            p += p < end && *p == '\r'; /* (cell_at saw the newline after it) */
            lines += p < end;
            p += p < end; /* the newline */
            break;
        }
        columns_row_done(&c, row);
        row++;
    }
    PyObject *columns = columns_result(&c, row);
    if (columns != NULL)
        result = Py_BuildValue("(nnnN)", (Py_ssize_t)(p - (const unsigned char *)buf.buf), row, lines, columns);
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    columns_free(&c);
    PyMem_Free(scratch.data);
    PyBuffer_Release(&map);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(data, begin, records, final) -> (ends, lines, malformed): the ends of up to `records` CSV records from "
     "`begin`, the newlines before the last, and whether one is not well-formed (see _csvscan.c)."},
    {"columns", (PyCFunction)(void (*)(void))columns, METH_FASTCALL,
     "columns(data, fields, records, begin) -> (end, rows, lines, columns) | None: up to `records` well-formed "
     "records from `begin` typed into the event fields' Arrow column buffers, or None to decline (see _csvscan.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "drainpipe.native._csvscan",
    "CSV record boundaries and well-formedness in one pass, and a block's cells into columns (see _csvscan.c).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__csvscan(void)
{
    return PyModule_Create(&module);
}
