/* drainpipe.native._groupstates, its string columns: codes for the distinct values of an Arrow string column and
 * gathers of its values by row, holding the GIL (included by _groupstates.c).
 *
 * Why: every stage after the intake (the L1 aggregation, the L1 and L2 merges, the cardinality guard, serve's RED
 * metrics) grouped string columns with pyarrow's dictionary_encode and gathered them with take. Each pyarrow call
 * lets the GIL go; in a process whose other threads want it, winning it back cost more than the call (measured: an
 * event batch's aggregation took 8.9 ms of its thread's CPU alone and 17.7 ms beside one busy thread). These do the
 * same work, the same results, and never let the GIL go.
 *
 * A column comes as a sequence of chunks, each a tuple (offsets, data, offset, length, validity): an Arrow string
 * array's buffers (int32 offsets; validity None when it has no nulls) and its slice; rows are numbered across the
 * chunks in order. A null reads as the empty string.
 *
 * encode(chunks) -> (codes, first)
 *   codes: int32 per row, the code of its value, codes numbered in the order values first occur (as Arrow's
 *   dictionary_encode numbers them); first: int64 per code, the row where its value first occurs.
 *
 * gather(parts, separator) -> (offsets, data)
 *   An Arrow string array's int32 offsets (rows + 1) and data: row i is the values of each part at its rows, joined
 *   by separator (bytes). parts: a sequence of (chunks, rows), rows an int64 array of row numbers, one array as
 *   long as the others per part. One part: a take.
 *
 * Errors: TypeError for arguments of the wrong shape, ValueError for an offset or row out of range, OverflowError
 * past 2 GiB of gathered data, MemoryError.
 */
#ifndef DRAINPIPE_STRINGS_H
#define DRAINPIPE_STRINGS_H

#include "_hash.h"

typedef struct {
    Py_buffer offsets, data, validity;
    int has_offsets, has_data, has_validity;
    Py_ssize_t offset, length;
} Chunk;

typedef struct {
    Chunk *chunks;
    Py_ssize_t count, rows;
} Column;

static void
column_release(Column *c)
{
    for (Py_ssize_t k = 0; k < c->count; k++) {
        Chunk *ch = &c->chunks[k];
        if (ch->has_offsets)
            PyBuffer_Release(&ch->offsets);
        if (ch->has_data)
            PyBuffer_Release(&ch->data);
        if (ch->has_validity)
            PyBuffer_Release(&ch->validity);
    }
    PyMem_Free(c->chunks);
    c->chunks = NULL;
    c->count = 0;
}

/* `obj` (a sequence of chunk tuples) as a Column; 0, or -1 with an exception set (and nothing held). */
static int
column_get(Column *c, PyObject *obj)
{
    c->chunks = NULL;
    c->count = c->rows = 0;
    PyObject *seq = PySequence_Fast(obj, "chunks: a sequence of (offsets, data, offset, length, validity)");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    c->chunks = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Chunk));
    if (c->chunks == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, k);
        Chunk *ch = &c->chunks[k];
        c->count = k + 1;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
            PyErr_SetString(PyExc_TypeError, "a chunk is a tuple (offsets, data, offset, length, validity)");
            goto fail;
        }
        ch->offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 2));
        ch->length = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3));
        if (PyErr_Occurred())
            goto fail;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 0), &ch->offsets, PyBUF_SIMPLE) < 0)
            goto fail;
        ch->has_offsets = 1;
        PyObject *data = PyTuple_GET_ITEM(t, 1);
        if (data != Py_None) { /* (an array of empty strings may have no data buffer) */
            if (PyObject_GetBuffer(data, &ch->data, PyBUF_SIMPLE) < 0)
                goto fail;
            ch->has_data = 1;
        }
        PyObject *validity = PyTuple_GET_ITEM(t, 4);
        if (validity != Py_None) {
            if (PyObject_GetBuffer(validity, &ch->validity, PyBUF_SIMPLE) < 0)
                goto fail;
            ch->has_validity = 1;
        }
        if (ch->offset < 0 || ch->length < 0 || ch->offset > PY_SSIZE_T_MAX / 8 - ch->length ||
            (ch->offset + ch->length + 1) * 4 > ch->offsets.len ||
            (ch->has_validity && (ch->offset + ch->length + 7) / 8 > ch->validity.len)) {
            PyErr_SetString(PyExc_ValueError, "a chunk's slice is outside its buffers");
            goto fail;
        }
        const int32_t *off = (const int32_t *)ch->offsets.buf + ch->offset;
        Py_ssize_t size = ch->has_data ? ch->data.len : 0;
        if (ch->length && (off[0] < 0 || off[ch->length] > size || off[0] > off[ch->length])) {
            PyErr_SetString(PyExc_ValueError, "a chunk's offsets are outside its data");
            goto fail;
        }
        c->rows += ch->length;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    column_release(c);
    return -1;
}

/* The value of row `i` of chunk `ch` (its slice's row): pointer and length (a null is empty). Offsets are checked
 * to be non-decreasing as they are read: a bad buffer gives -1 (never a read outside the data). */
static inline Py_ssize_t
chunk_value(const Chunk *ch, Py_ssize_t i, const unsigned char **s)
{
    Py_ssize_t at = ch->offset + i;
    if (ch->has_validity && !(((const unsigned char *)ch->validity.buf)[at >> 3] >> (at & 7) & 1)) {
        *s = (const unsigned char *)"";
        return 0;
    }
    const int32_t *off = (const int32_t *)ch->offsets.buf;
    int32_t a = off[at], b = off[at + 1];
    if (a < 0 || b < a || b > (ch->has_data ? ch->data.len : 0))
        return -1;
    *s = ch->has_data ? (const unsigned char *)ch->data.buf + a : (const unsigned char *)"";
    return b - a;
}

static PyObject *
strings_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "encode(chunks)");
        return NULL;
    }
    Column col;
    if (column_get(&col, args[0]) < 0)
        return NULL;
    PyObject *codes_out = NULL, *first_out = NULL, *result = NULL;
    int32_t *codes;
    int64_t *first = NULL;
    Py_ssize_t distinct = 0, cap = 16;
    int64_t *slots = NULL; /* per slot: code + 1, 0 empty */
    uint64_t *hashes = NULL; /* per code */
    const unsigned char **values = NULL; /* per code: its bytes, and length */
    Py_ssize_t *lengths = NULL, room = 16;
    if (col.rows > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "encode: more than 2^31 rows");
        goto done;
    }
    if (!(codes_out = new_array(col.rows * 4, (void **)&codes)))
        goto done;
    slots = PyMem_Calloc((size_t)cap, sizeof(int64_t));
    hashes = PyMem_Malloc((size_t)room * sizeof(uint64_t));
    values = PyMem_Malloc((size_t)room * sizeof(*values));
    lengths = PyMem_Malloc((size_t)room * sizeof(Py_ssize_t));
    first = PyMem_Malloc((size_t)room * sizeof(int64_t));
    if (!slots || !hashes || !values || !lengths || !first) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t row = 0;
    /* the previous row's value and code: rows come in runs (an OTLP export's spans share their resource's service
     * and instance), and a run's next row costs a compare instead of a hash */
    const unsigned char *run_s = (const unsigned char *)"";
    Py_ssize_t run_len = -1;
    int32_t run_code = 0;
    for (Py_ssize_t k = 0; k < col.count; k++) {
        const Chunk *ch = &col.chunks[k];
        for (Py_ssize_t i = 0; i < ch->length; i++, row++) {
            const unsigned char *s;
            Py_ssize_t len = chunk_value(ch, i, &s);
            if (len < 0) {
                PyErr_SetString(PyExc_ValueError, "encode: offsets out of order");
                goto done;
            }
            if (len == run_len && (s == run_s || memcmp(s, run_s, (size_t)len) == 0)) {
                codes[row] = run_code;
                continue;
            }
            uint64_t h = bytes_hash(s, (size_t)len);
            Py_ssize_t mask = cap - 1, at = (Py_ssize_t)(h & (uint64_t)mask);
            int64_t code = -1;
            while (slots[at]) {
                int64_t c = slots[at] - 1;
                if (hashes[c] == h && lengths[c] == len && memcmp(values[c], s, (size_t)len) == 0) {
                    code = c;
                    break;
                }
                at = (at + 1) & mask;
            }
            if (code < 0) {
                if (distinct == room) {
                    room *= 2;
                    void *a = PyMem_Realloc(hashes, (size_t)room * sizeof(uint64_t));
                    if (a) hashes = a;
                    void *b = a ? PyMem_Realloc(values, (size_t)room * sizeof(*values)) : NULL;
                    if (b) values = b;
                    void *c = b ? PyMem_Realloc(lengths, (size_t)room * sizeof(Py_ssize_t)) : NULL;
                    if (c) lengths = c;
                    void *d = c ? PyMem_Realloc(first, (size_t)room * sizeof(int64_t)) : NULL;
                    if (!d) {
                        PyErr_NoMemory();
                        goto done;
                    }
                    first = d;
                }
                code = distinct++;
                hashes[code] = h;
                values[code] = s;
                lengths[code] = len;
                first[code] = row;
                slots[at] = code + 1;
                if (distinct * 2 > cap) { /* grow the table: at most half full */
                    Py_ssize_t bigger = cap * 2;
                    int64_t *grown = PyMem_Calloc((size_t)bigger, sizeof(int64_t));
                    if (!grown) {
                        PyErr_NoMemory();
                        goto done;
                    }
                    for (Py_ssize_t c2 = 0; c2 < distinct; c2++) {
                        Py_ssize_t p = (Py_ssize_t)(hashes[c2] & (uint64_t)(bigger - 1));
                        while (grown[p])
                            p = (p + 1) & (bigger - 1);
                        grown[p] = c2 + 1;
                    }
                    PyMem_Free(slots);
                    slots = grown;
                    cap = bigger;
                }
            }
            codes[row] = run_code = (int32_t)code;
            run_s = s;
            run_len = len;
        }
    }
    int64_t *f;
    if (!(first_out = new_array(distinct * 8, (void **)&f)))
        goto done;
    if (distinct)
        memcpy(f, first, (size_t)distinct * 8);
    result = PyTuple_Pack(2, codes_out, first_out);
done:
    Py_XDECREF(codes_out);
    Py_XDECREF(first_out);
    PyMem_Free(slots);
    PyMem_Free(hashes);
    PyMem_Free((void *)values);
    PyMem_Free(lengths);
    PyMem_Free(first);
    column_release(&col);
    return result;
}

/* The chunk and row within it of row `row` of `col` (rows of the chunks in order); -1 when out of range. `starts`:
 * per chunk, its first row. */
static inline Py_ssize_t
locate(const Column *col, const Py_ssize_t *starts, int64_t row, Py_ssize_t *i)
{
    if (row < 0 || row >= col->rows)
        return -1;
    Py_ssize_t lo = 0, hi = col->count - 1; /* the last chunk whose start is <= row (chunks may be empty) */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        if (starts[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    while (lo < col->count - 1 && row - starts[lo] >= col->chunks[lo].length)
        lo++; /* (never taken: the last chunk starting at or before a row in range holds it) */
    *i = (Py_ssize_t)(row - starts[lo]);
    return lo;
}

static PyObject *
strings_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "gather(parts, separator)");
        return NULL;
    }
    Py_buffer sep;
    if (PyObject_GetBuffer(args[1], &sep, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "parts: a sequence of (chunks, rows)");
    if (seq == NULL) {
        PyBuffer_Release(&sep);
        return NULL;
    }
    Py_ssize_t nparts = PySequence_Fast_GET_SIZE(seq), n = -1, got = 0;
    Column *cols = PyMem_Calloc((size_t)(nparts ? nparts : 1), sizeof(Column));
    Rows *rows = PyMem_Calloc((size_t)(nparts ? nparts : 1), sizeof(Rows));
    Py_ssize_t **starts = PyMem_Calloc((size_t)(nparts ? nparts : 1), sizeof(Py_ssize_t *));
    PyObject *off_out = NULL, *data_out = NULL, *result = NULL;
    if (!cols || !rows || !starts) {
        PyErr_NoMemory();
        goto done;
    }
    if (nparts == 0) {
        PyErr_SetString(PyExc_ValueError, "gather: no parts");
        goto done;
    }
    for (; got < nparts; got++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, got);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
            PyErr_SetString(PyExc_TypeError, "a part is a tuple (chunks, rows)");
            goto done;
        }
        if (column_get(&cols[got], PyTuple_GET_ITEM(t, 0)) < 0)
            goto done;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 1), &rows[got].view, PyBUF_C_CONTIGUOUS) < 0) {
            column_release(&cols[got]);
            goto done;
        }
        rows[got].held = 1;
        rows[got].data = rows[got].view.buf;
        if (rows[got].view.len % 8 || (n >= 0 && rows[got].view.len / 8 != n)) {
            got++;
            PyErr_SetString(PyExc_ValueError, "gather: the parts' rows are int64 arrays of one length");
            goto done;
        }
        n = rows[got].view.len / 8;
        if (!(starts[got] = PyMem_Malloc((size_t)(cols[got].count ? cols[got].count : 1) * sizeof(Py_ssize_t)))) {
            got++;
            PyErr_NoMemory();
            goto done;
        }
        Py_ssize_t at = 0;
        for (Py_ssize_t k = 0; k < cols[got].count; k++) {
            starts[got][k] = at;
            at += cols[got].chunks[k].length;
        }
    }
    int32_t *off;
    if (!(off_out = new_array((n + 1) * 4, (void **)&off)))
        goto done;
    /* two passes: the lengths (and every row checked), then the bytes */
    int64_t total = 0;
    off[0] = 0;
    for (int pass = 0; pass < 2; pass++) {
        char *data = NULL;
        if (pass == 1) {
            if (!(data_out = new_array((Py_ssize_t)total, (void **)&data)))
                goto done;
        }
        int64_t at = 0;
        for (Py_ssize_t r = 0; r < n; r++) {
            for (Py_ssize_t p = 0; p < nparts; p++) {
                Py_ssize_t i, k = locate(&cols[p], starts[p], ((const int64_t *)rows[p].data)[r], &i);
                const unsigned char *s;
                Py_ssize_t len = k < 0 ? -1 : chunk_value(&cols[p].chunks[k], i, &s);
                if (len < 0) {
                    PyErr_SetString(PyExc_ValueError, "gather: a row out of range, or offsets out of order");
                    goto done;
                }
                if (p) {
                    if (pass)
                        memcpy(data + at, sep.buf, (size_t)sep.len);
                    at += sep.len;
                }
                if (pass && len)
                    memcpy(data + at, s, (size_t)len);
                at += len;
            }
            if (at > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "gather: more than 2 GiB of strings");
                goto done;
            }
            off[r + 1] = (int32_t)at;
        }
        total = at;
    }
    result = PyTuple_Pack(2, off_out, data_out);
done:
    Py_XDECREF(off_out);
    Py_XDECREF(data_out);
    for (Py_ssize_t p = 0; p < got; p++) {
        column_release(&cols[p]);
        rows_release(&rows[p]);
        PyMem_Free(starts[p]);
    }
    PyMem_Free(cols);
    PyMem_Free(rows);
    PyMem_Free(starts);
    Py_DECREF(seq);
    PyBuffer_Release(&sep);
    return result;
}

#endif
