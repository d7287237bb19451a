/* drainpipe.inputs._csvscan: where the records of a CSV block end, and whether they are well-formed, in one pass.
 *
 * Why C: planning a CSV file into parts (and reading one) needs its record boundaries: the newlines outside quoted
 * fields. numpy found them from the quote parity at ~300 MB/s with its temporaries (every string field quoted, as
 * pyarrow and many tools write it, is ~100k quotes per MB), and the planner's scan became the slowest step of a
 * whole run. A byte loop with four states does it, and checks every record well-formed on the way.
 *
 * Well-formed is RFC 4180 as Python's strict csv reader takes it, the rule csv_format.py's numpy check
 * (_well_formed) also applies: a quoted field opens at a field's start and closes before a comma or the record's
 * end, "" inside it is a quote; an unquoted field has no quote and no carriage return; a carriage return outside
 * quotes is followed by a newline. In well-formed data the record ends are exactly the newlines with an even count
 * of quotes before them, which is how the fallback cuts.
 *
 * scan(data, begin, records, final) -> (ends, malformed)
 *   ends: the offsets just after the record-ending newlines from `begin`, at most `records` of them, as int64
 *   bytes; malformed: True if the record after the last end is not well-formed (with `final`, the data ends the
 *   file, so a record left in quotes is not). Scanning stops there: every record before the last end is
 *   well-formed. Runs of plain bytes are skipped in a tight loop, and a quoted field with memchr.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include <string.h>

enum { FIELD_START, UNQUOTED, QUOTED, QUOTE_IN_QUOTED, CARRIAGE };

/* the bytes that end a run of an unquoted field */
static const unsigned char SPECIAL[256] = {['"'] = 1, [','] = 1, ['\r'] = 1, ['\n'] = 1};

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
    Py_ssize_t n = buf.len, found = 0, i = begin;
    int state = FIELD_START, malformed = 0;
    while (i < n && found < records) {
        if (state == QUOTED) { /* to the next quote, newlines and commas included */
            const unsigned char *q = memchr(p + i, '"', (size_t)(n - i));
            if (q == NULL) {
                i = n;
                break;
            }
            i = q - p + 1;
            state = QUOTE_IN_QUOTED;
            continue;
        }
        if (state == UNQUOTED) { /* to the next byte that means something */
            while (i < n && !SPECIAL[p[i]])
                i++;
            if (i >= n)
                break;
        }
        unsigned char c = p[i++];
        if (state == CARRIAGE) {
            if (c != '\n') {
                malformed = 1;
                goto done;
            }
        } else if (c == '"') {
            if (state == QUOTE_IN_QUOTED) {
                state = QUOTED; /* "" inside quotes */
                continue;
            }
            if (state != FIELD_START) {
                malformed = 1; /* a quote inside an unquoted field */
                goto done;
            }
            state = QUOTED;
            continue;
        } else if (c == ',') {
            state = FIELD_START;
            continue;
        } else if (c == '\r') {
            state = CARRIAGE;
            continue;
        } else if (c != '\n') {
            if (state == QUOTE_IN_QUOTED) {
                malformed = 1; /* text after a closing quote */
                goto done;
            }
            state = UNQUOTED;
            continue;
        }
        ends[found++] = (int64_t)i; /* a newline outside quotes: the record ends after it */
        state = FIELD_START;
    }
    if (final && found < records && (state == QUOTED || state == CARRIAGE))
        malformed = 1; /* the file ends inside quotes, or in a carriage return */
done:
    PyBuffer_Release(&buf);
    if (_PyBytes_Resize(&out, found * 8) < 0)
        return NULL;
    return Py_BuildValue("(NO)", out, malformed ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(data, begin, records, final) -> (ends, lines, malformed): the ends of up to `records` CSV records from "
     "`begin` and whether one is not well-formed (see _csvscan.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "drainpipe.inputs._csvscan",
    "CSV record boundaries and well-formedness in one pass (see _csvscan.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__csvscan(void)
{
    return PyModule_Create(&module);
}
