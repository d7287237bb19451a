/* drainpipe.native (the input scanners): what the C scanners of request events share (included by _jsonscan.c and _csvscan.c).
 *
 * A scanner fills the event fields' columns as Arrow buffers, row by row, and hands them to Python as
 * (null count, validity bitmap or None, value buffers...) per field, in the event schema's order, then trace_id as
 * text (validation decodes it): ts int64, latency_ms float64, status a bitmap, db_statement and trace_id int32
 * offsets and data, and service, instance and endpoint dictionary-encoded: int32 indices (0 for a null), then the
 * distinct values' int32 offsets and data, in the order they first appear (at least one value: "" if the column has
 * none). Why encoded here: those three are what aggregation groups by, a few distinct values in thousands of rows;
 * a value met again costs a hash and a compare instead of a copy, and aggregation and validation then work on the
 * few values and the indices instead of every row's string.
 * Nulls are kept as nulls; the caller's columnar validation applies the event rules. Numbers are parsed as JSON
 * numbers (the grammar of both formats' number cells: _numbers.h), converted as Python converts them.
 */
#ifndef DRAINPIPE_COLUMNS_H
#define DRAINPIPE_COLUMNS_H

#include "_hash.h"
#include "_numbers.h"

enum { F_TS, F_SERVICE, F_INSTANCE, F_ENDPOINT, F_LATENCY, F_STATUS, F_DB, F_TRACE, NFIELDS };
#define NSTRINGS 2 /* the plain strings: db_statement, trace_id */
static const int STRING_FIELDS[NSTRINGS] = {F_DB, F_TRACE};
#define IS_ENCODED(f) ((f) >= F_SERVICE && (f) <= F_ENDPOINT) /* service, instance, endpoint */

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

/* A dictionary-encoded string column: each row's index into the distinct values, found by an open-addressing hash
 * table (value index + 1 per slot, 0 empty), the previous row's value tried first (a service is mostly the same from
 * row to row). */
typedef struct {
    int32_t *indices;
    StrCol values; /* offsets: one per distinct value, + 1 */
    int32_t *table;
    size_t count, cap;
    int32_t last; /* the previous value's index, -1 before the first */
} DictCol;

static inline int
dict_equal(const DictCol *d, int32_t k, const unsigned char *s, size_t n)
{
    int32_t start = d->values.offsets[k];
    return (size_t)(d->values.offsets[k + 1] - start) == n && !memcmp(d->values.data + start, s, n);
}

/* Row `row` holds the n bytes at s (readable up to limit); 0, or -1 with MemoryError set. */
static int
dict_append(DictCol *d, Py_ssize_t row, const unsigned char *s, size_t n, const unsigned char *limit)
{
    if (d->last >= 0 && dict_equal(d, d->last, s, n)) {
        d->indices[row] = d->last;
        return 0;
    }
    size_t h = (size_t)bytes_hash(s, n) & (d->cap - 1);
    for (int32_t at; (at = d->table[h]); h = (h + 1) & (d->cap - 1))
        if (dict_equal(d, at - 1, s, n)) {
            d->indices[row] = d->last = at - 1;
            return 0;
        }
    /* a new value (at most one per row, so the offsets, sized for the rows, have room) */
    if (strcol_append(&d->values, s, n, limit) < 0)
        return -1;
    d->values.offsets[++d->count] = (int32_t)d->values.len;
    d->table[h] = (int32_t)d->count;
    d->indices[row] = d->last = (int32_t)d->count - 1;
    if (2 * d->count > d->cap) { /* keep the table at most half full */
        size_t cap = 2 * d->cap;
        int32_t *table = PyMem_Calloc(cap, sizeof *table);
        if (table == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t k = 0; k < d->count; k++) {
            int32_t start = d->values.offsets[k];
            size_t g = (size_t)bytes_hash((const unsigned char *)d->values.data + start,
                                          (size_t)(d->values.offsets[k + 1] - start)) & (cap - 1);
            while (table[g])
                g = (g + 1) & (cap - 1);
            table[g] = (int32_t)k + 1;
        }
        PyMem_Free(d->table);
        d->table = table, d->cap = cap;
    }
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
    StrCol str[NFIELDS];  /* the plain strings' */
    DictCol dict[NFIELDS]; /* the encoded strings' */
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
    for (int f = F_SERVICE; f <= F_ENDPOINT; f++) {
        DictCol *d = &c->dict[f];
        d->last = -1;
        d->cap = 64;
        d->indices = PyMem_Calloc((size_t)rows, sizeof *d->indices); /* a null row's index stays 0 */
        d->values.offsets = PyMem_Malloc((size_t)(rows + 2) * sizeof(int32_t)); /* (+1: "" for an empty column) */
        d->table = PyMem_Calloc(d->cap, sizeof *d->table);
        if (!d->indices || !d->values.offsets || !d->table)
            goto nomem;
        d->values.offsets[0] = 0;
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

/* Field f of row `row` is the n bytes at s (readable up to limit): a string field's value; 0, or -1 with MemoryError
 * set. */
static inline int
columns_string(Columns *c, int f, Py_ssize_t row, const unsigned char *s, size_t n, const unsigned char *limit)
{
    return IS_ENCODED(f) ? dict_append(&c->dict[f], row, s, n, limit) : strcol_append(&c->str[f], s, n, limit);
}

/* The columns of the first `rows` rows as Python values (see the top), or NULL with an exception set. */

static PyObject *
columns_result(Columns *c, Py_ssize_t rows)
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
        else if (IS_ENCODED(f)) {
            DictCol *d = &c->dict[f];
            if (d->count == 0) /* no value: "" as index 0, which the null rows hold */
                d->values.offsets[++d->count] = 0;
            col = Py_BuildValue("(nNNNN)", nulls, validity, bytes_of(d->indices, (size_t)rows * sizeof(int32_t)),
                                bytes_of(d->values.offsets, (d->count + 1) * sizeof(int32_t)),
                                bytes_of(d->values.data ? d->values.data : "", d->values.len));
        }
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
        PyMem_Free(c->dict[f].indices);
        PyMem_Free(c->dict[f].values.offsets);
        PyMem_Free(c->dict[f].values.data);
        PyMem_Free(c->dict[f].table);
    }
}

#endif /* DRAINPIPE_COLUMNS_H */
