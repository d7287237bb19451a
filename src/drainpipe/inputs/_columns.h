/* drainpipe.inputs: what the C scanners of request events share (included by _jsonscan.c and _csvscan.c).
 *
 * A scanner fills the event fields' columns as Arrow buffers, row by row, and hands them to Python as
 * (null count, validity bitmap or None, value buffers...) per field, in the event schema's order, then trace_id as
 * text (validation decodes it): ts int64, the strings int32 offsets and data, latency_ms float64, status a bitmap.
 * Nulls are kept as nulls; the caller's columnar validation applies the event rules. Numbers are parsed as JSON
 * numbers (the grammar of both formats' number cells: _numbers.h), converted as Python converts them.
 */
#ifndef DRAINPIPE_COLUMNS_H
#define DRAINPIPE_COLUMNS_H

#include "_numbers.h"

enum { F_TS, F_SERVICE, F_INSTANCE, F_ENDPOINT, F_LATENCY, F_STATUS, F_DB, F_TRACE, NFIELDS };
#define NSTRINGS 5 /* service, instance, endpoint, db_statement, trace_id */
static const int STRING_FIELDS[NSTRINGS] = {F_SERVICE, F_INSTANCE, F_ENDPOINT, F_DB, F_TRACE};

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
